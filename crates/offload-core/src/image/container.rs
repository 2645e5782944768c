//! Containers that hold several device images, each labelled with the target it is for:
//!
//! - the **LLVM offload binary** (magic `10 ff 10 ad`, what `clang-offload-packager` writes and
//!   clang's `--offload-new-driver` embeds), one or more concatenated, each with a string map
//!   (`triple`, `arch`) and an image kind;
//! - the **clang offload bundle** (`__CLANG_OFFLOAD_BUNDLE__`, what `clang-offload-bundler`
//!   writes for bitcode and assembly), entries named `<kind>-<arch>-<vendor>-<os>-<env>[-<id>]`;
//! - both **embedded in an ELF file**: offload binaries in a `.llvm.offloading` section, bundles
//!   as `__CLANG_OFFLOAD_BUNDLE__<id>` sections (`clang-offload-bundler -type=o`).
//!
//! Reading is bounded: every offset and size is checked against the data, and a malformed
//! container is an error that names the field and its offset. Which entry a device runs is
//! decided by the plugin (the generic device layer), which knows the device.

use crate::error::{Error, Result};
use crate::image::{OFFLOAD_BINARY_MAGIC, OFFLOAD_BUNDLE_MAGIC};

/// Most entries a container may list (more is corruption, not a real container).
const MAX_ENTRIES: u64 = 4096;

/// One image in a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry<'a> {
    /// The image bytes.
    pub bytes: &'a [u8],
    /// The target triple it is labelled with (empty if none).
    pub triple: String,
    /// The compute-unit kind it is labelled with (`sm_90`, `gfx90a:xnack+`, `znver3`; empty or
    /// `generic` for none).
    pub arch: String,
    /// Who made it (`openmp`, `cuda`, `hip`, ...), for messages.
    pub producer: String,
    /// Where it is in the container, for messages (`offload binary 2`, `bundle entry 'x'`).
    pub origin: String,
}

impl Entry<'_> {
    /// `x86_64-unknown-linux-gnu/znver3` (or just the triple).
    pub fn label(&self) -> String {
        if self.arch.is_empty() {
            self.triple.clone()
        } else {
            format!("{}/{}", self.triple, self.arch)
        }
    }
}

/// A container and its entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container<'a> {
    /// `LLVM offload binary`, `clang offload bundle`, or either `in ELF sections`.
    pub format: String,
    /// The device images, in container order (bundle `host` entries are left out: they are the
    /// host program, not device code).
    pub entries: Vec<Entry<'a>>,
}

fn bad(what: impl std::fmt::Display) -> Error {
    Error::InvalidImage(what.to_string())
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// `bytes[offset..offset + len]`, or an error naming `what`.
fn slice<'a>(bytes: &'a [u8], offset: u64, len: u64, what: &str) -> Result<&'a [u8]> {
    offset
        .checked_add(len)
        .filter(|end| *end <= bytes.len() as u64)
        .map(|end| &bytes[offset as usize..end as usize])
        .ok_or_else(|| {
            bad(format!(
                "{what} at offset {offset}, {len} bytes, runs past the end of the data ({} bytes)",
                bytes.len()
            ))
        })
}

/// The NUL-terminated string at `offset` of `bytes`.
fn c_string(bytes: &[u8], offset: u64, what: &str) -> Result<String> {
    let rest = slice(bytes, offset, 0, what).map(|_| &bytes[offset as usize..])?;
    let end = rest
        .iter()
        .position(|&b| b == 0)
        .ok_or_else(|| bad(format!("{what} at offset {offset} is not NUL-terminated")))?;
    String::from_utf8(rest[..end].to_vec())
        .map_err(|_| bad(format!("{what} at offset {offset} is not UTF-8")))
}

fn image_kind_name(kind: u16) -> &'static str {
    match kind {
        1 => "object",
        2 => "bitcode",
        3 => "cubin",
        4 => "fatbinary",
        5 => "PTX",
        _ => "image",
    }
}

fn producer_name(kind: u16) -> String {
    match kind {
        0 => String::new(),
        1 => "openmp".into(),
        2 => "cuda".into(),
        4 => "hip".into(),
        8 => "sycl".into(),
        k => format!("producer {k}"),
    }
}

/// One or more concatenated offload binaries starting at `bytes[0]`.
fn offload_binaries<'a>(bytes: &'a [u8], place: &str) -> Result<Vec<Entry<'a>>> {
    let mut entries = Vec::new();
    let mut at = 0usize;
    let mut index = 0;
    while at < bytes.len() {
        let rest = &bytes[at..];
        // Binaries may be padded to 8 bytes; zeros after the last one end the list.
        if rest.iter().all(|&b| b == 0) {
            break;
        }
        let here = format!("{place}offload binary {index} (at byte {at})");
        if rest.len() < 32 || rest[..4] != OFFLOAD_BINARY_MAGIC {
            return Err(bad(format!(
                "{here}: expected the magic 10 ff 10 ad and a 32-byte header"
            )));
        }
        let version = u32_at(rest, 4);
        if version != 1 {
            return Err(bad(format!(
                "{here}: version {version} (field at offset 4); this runtime reads version 1 \
                 (LLVM 19)"
            )));
        }
        let size = u64_at(rest, 8);
        let binary = slice(rest, 0, size, &format!("{here}: size (offset 8)"))?;
        if size < 32 {
            return Err(bad(format!(
                "{here}: size {size} (offset 8) is smaller than its header"
            )));
        }
        let entry_offset = u64_at(rest, 16);
        let entry_size = u64_at(rest, 24);
        if entry_size < 40 {
            return Err(bad(format!(
                "{here}: entry size {entry_size} (offset 24) is smaller than an entry (40)"
            )));
        }
        let entry = slice(
            binary,
            entry_offset,
            entry_size,
            &format!("{here}: entry (offset 16)"),
        )?;
        let image_kind = u16_at(entry, 0);
        let producer = u16_at(entry, 2);
        let strings_at = u64_at(entry, 8);
        let strings = u64_at(entry, 16);
        let image_at = u64_at(entry, 24);
        let image_size = u64_at(entry, 32);
        if strings > size / 16 {
            return Err(bad(format!(
                "{here}: {strings} strings cannot fit {size} bytes"
            )));
        }
        let table = slice(
            binary,
            strings_at,
            strings * 16,
            &format!("{here}: string map"),
        )?;
        let (mut triple, mut arch) = (String::new(), String::new());
        for s in 0..strings as usize {
            let key = c_string(
                binary,
                u64_at(table, s * 16),
                &format!("{here}: string key {s}"),
            )?;
            let value = c_string(
                binary,
                u64_at(table, s * 16 + 8),
                &format!("{here}: string value {s}"),
            )?;
            match key.as_str() {
                "triple" => triple = value,
                "arch" => arch = value,
                _ => {}
            }
        }
        let image = slice(binary, image_at, image_size, &format!("{here}: image"))?;
        entries.push(Entry {
            bytes: image,
            triple,
            arch: if arch == "generic" {
                String::new()
            } else {
                arch
            },
            producer: producer_name(producer),
            origin: format!("{here}, {}", image_kind_name(image_kind)),
        });
        if entries.len() as u64 > MAX_ENTRIES {
            return Err(bad(format!(
                "{place}more than {MAX_ENTRIES} offload binaries"
            )));
        }
        index += 1;
        at += size as usize;
    }
    Ok(entries)
}

/// A bundle id `<kind>-<arch>-<vendor>-<os>-<env>[-<target id>]`: `(kind, triple, target id)`.
fn bundle_id(id: &str) -> (String, String, String) {
    let (kind, rest) = id.split_once('-').unwrap_or((id, ""));
    let parts: Vec<&str> = rest.splitn(5, '-').collect();
    if parts.len() == 5 {
        let triple = parts[..4].join("-");
        let target = parts[4].trim_end_matches('-');
        (
            kind.into(),
            triple.trim_end_matches('-').into(),
            target.into(),
        )
    } else {
        (kind.into(), rest.into(), String::new())
    }
}

fn bundle_entry<'a>(bytes: &'a [u8], id: &str, origin: String) -> Option<Entry<'a>> {
    let (kind, triple, target) = bundle_id(id);
    // `host` entries are the host program the device code was bundled with.
    (kind != "host").then_some(Entry {
        bytes,
        triple,
        arch: target,
        producer: kind,
        origin,
    })
}

fn offload_bundle(bytes: &[u8]) -> Result<Vec<Entry<'_>>> {
    if bytes.len() < 32 {
        return Err(bad(
            "clang offload bundle: truncated header (32 bytes needed)",
        ));
    }
    let count = u64_at(bytes, 24);
    if count > MAX_ENTRIES || count > (bytes.len() as u64 - 32) / 24 {
        return Err(bad(format!(
            "clang offload bundle: {count} entries (field at offset 24) cannot fit {} bytes",
            bytes.len()
        )));
    }
    let mut at = 32u64;
    let mut entries = Vec::new();
    for i in 0..count {
        let head = slice(
            bytes,
            at,
            24,
            &format!("clang offload bundle: entry {i} header"),
        )?;
        let (offset, size, id_len) = (u64_at(head, 0), u64_at(head, 8), u64_at(head, 16));
        let id = slice(
            bytes,
            at + 24,
            id_len,
            &format!("clang offload bundle: entry {i} id"),
        )?;
        let id = std::str::from_utf8(id)
            .map_err(|_| bad(format!("clang offload bundle: entry {i} id is not UTF-8")))?;
        let image = slice(
            bytes,
            offset,
            size,
            &format!("clang offload bundle: entry {i} ('{id}')"),
        )?;
        entries.extend(bundle_entry(image, id, format!("bundle entry {i} '{id}'")));
        at += 24 + id_len;
    }
    Ok(entries)
}

/// Offload sections of an ELF file, if it has any.
fn elf_sections(bytes: &[u8]) -> Result<Option<(String, Vec<Entry<'_>>)>> {
    use object::{Object, ObjectSection};
    // Parsed aligned; the original is sliced by file offsets.
    let aligned = crate::image::Aligned::new(bytes);
    let copy = aligned.bytes();
    let Ok(file) = object::File::parse(copy) else {
        // Not an ELF we can read sections of: the native-image checks say why.
        return Ok(None);
    };
    let mut entries = Vec::new();
    let mut formats = Vec::new();
    for section in file.sections() {
        let Ok(name) = section.name() else { continue };
        let is_binaries = name == ".llvm.offloading";
        let bundle = name.strip_prefix("__CLANG_OFFLOAD_BUNDLE__");
        if !is_binaries && bundle.is_none() {
            continue;
        }
        let Some((offset, size)) = section.file_range() else {
            continue;
        };
        let data = slice(bytes, offset, size, &format!("ELF section {name}"))?;
        if is_binaries {
            entries.extend(offload_binaries(data, "ELF section .llvm.offloading: ")?);
            formats.push("LLVM offload binaries in ELF section .llvm.offloading");
        } else if let Some(id) = bundle {
            entries.extend(bundle_entry(data, id, format!("ELF section '{name}'")));
            if !formats.contains(&"clang offload bundle in ELF sections") {
                formats.push("clang offload bundle in ELF sections");
            }
        }
        if entries.len() as u64 > MAX_ENTRIES {
            return Err(bad(format!(
                "more than {MAX_ENTRIES} embedded offload images"
            )));
        }
    }
    Ok((!formats.is_empty()).then(|| (formats.join(" and "), entries)))
}

/// The container in `bytes`, or `None` when the bytes are a single image.
pub fn parse(bytes: &[u8]) -> Result<Option<Container<'_>>> {
    if bytes.starts_with(&OFFLOAD_BINARY_MAGIC) {
        return Ok(Some(Container {
            format: "LLVM offload binary".into(),
            entries: offload_binaries(bytes, "")?,
        }));
    }
    if bytes.starts_with(OFFLOAD_BUNDLE_MAGIC) {
        return Ok(Some(Container {
            format: "clang offload bundle".into(),
            entries: offload_bundle(bytes)?,
        }));
    }
    if bytes.starts_with(&crate::image::ELF_MAGIC) {
        return Ok(elf_sections(bytes)?.map(|(format, entries)| Container { format, entries }));
    }
    Ok(None)
}

impl Container<'_> {
    /// `LLVM offload binary with 2 images: x86_64-unknown-linux-gnu/znver3 (offload binary 0,
    /// object), ...`, for errors.
    pub fn describe(&self) -> String {
        if self.entries.is_empty() {
            return format!("{} with no device images", self.format);
        }
        let list: Vec<String> = self
            .entries
            .iter()
            .map(|e| format!("{} ({})", e.label(), e.origin))
            .collect();
        format!(
            "{} with {} image{}: {}",
            self.format,
            self.entries.len(),
            if self.entries.len() == 1 { "" } else { "s" },
            list.join("; ")
        )
    }
}

/// One image to pack with [`offload_binary`].
#[derive(Debug, Clone, Copy)]
pub struct PackImage<'a> {
    /// The image bytes.
    pub bytes: &'a [u8],
    /// Its target triple (`x86_64-unknown-linux-gnu`, `nvptx64-nvidia-cuda`).
    pub triple: &'a str,
    /// Its compute-unit kind (`sm_90`, `gfx90a`), or empty.
    pub arch: &'a str,
}

/// The offload-binary image kind of `bytes`: 2 bitcode, 3 cubin, 5 PTX, 1 any other object.
fn pack_kind(bytes: &[u8]) -> u16 {
    match crate::image::classify(bytes) {
        Ok(crate::ImageKind::Bitcode { .. } | crate::ImageKind::LlvmIr) => 2,
        Ok(crate::ImageKind::Ptx) => 5,
        Ok(crate::ImageKind::Elf(info)) if info.machine == crate::image::machine::CUDA => 3,
        _ => 1,
    }
}

/// LLVM offload binaries (format version 1, as `clang-offload-packager` writes), one per
/// image, concatenated and each padded to 8 bytes: a container every plugin picks its entry
/// from. Producer `openmp`, the string map `triple` and `arch`.
pub fn offload_binary(images: &[PackImage<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    for image in images {
        let strings = [("triple", image.triple), ("arch", image.arch)];
        // Header (32), entry (40), string table (16 per string), then the strings and the
        // image, 8-aligned.
        let table_at = 32 + 40;
        let pool_at = table_at + 16 * strings.len();
        let mut pool = Vec::new();
        let mut offsets = Vec::new();
        for (k, v) in strings {
            let ko = pool_at + pool.len();
            pool.extend_from_slice(k.as_bytes());
            pool.push(0);
            let vo = pool_at + pool.len();
            pool.extend_from_slice(v.as_bytes());
            pool.push(0);
            offsets.push((ko as u64, vo as u64));
        }
        let image_at = (pool_at + pool.len()).div_ceil(8) * 8;
        let size = (image_at + image.bytes.len()).div_ceil(8) * 8;
        let mut b = vec![0u8; size];
        b[..4].copy_from_slice(&OFFLOAD_BINARY_MAGIC);
        b[4..8].copy_from_slice(&1u32.to_le_bytes());
        b[8..16].copy_from_slice(&(size as u64).to_le_bytes());
        b[16..24].copy_from_slice(&32u64.to_le_bytes());
        b[24..32].copy_from_slice(&40u64.to_le_bytes());
        b[32..34].copy_from_slice(&pack_kind(image.bytes).to_le_bytes());
        b[34..36].copy_from_slice(&1u16.to_le_bytes());
        b[40..48].copy_from_slice(&(table_at as u64).to_le_bytes());
        b[48..56].copy_from_slice(&(strings.len() as u64).to_le_bytes());
        b[56..64].copy_from_slice(&(image_at as u64).to_le_bytes());
        b[64..72].copy_from_slice(&(image.bytes.len() as u64).to_le_bytes());
        for (i, (k, v)) in offsets.iter().enumerate() {
            let at = table_at + i * 16;
            b[at..at + 8].copy_from_slice(&k.to_le_bytes());
            b[at + 8..at + 16].copy_from_slice(&v.to_le_bytes());
        }
        b[pool_at..pool_at + pool.len()].copy_from_slice(&pool);
        b[image_at..image_at + image.bytes.len()].copy_from_slice(image.bytes);
        out.extend_from_slice(&b);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binary(image: &[u8], triple: &str, arch: &str) -> Vec<u8> {
        offload_binary(&[PackImage {
            bytes: image,
            triple,
            arch,
        }])
    }

    #[test]
    fn concatenated_offload_binaries_are_read() {
        let mut all = binary(b"first image", "x86_64-unknown-linux-gnu", "znver3");
        all.extend(binary(b"BC\xc0\xde", "amdgcn-amd-amdhsa", "gfx90a:xnack+"));
        let c = parse(&all).unwrap().unwrap();
        assert_eq!(c.entries.len(), 2);
        assert_eq!(c.entries[0].bytes, b"first image");
        assert_eq!(c.entries[0].label(), "x86_64-unknown-linux-gnu/znver3");
        assert_eq!(c.entries[1].arch, "gfx90a:xnack+");
        assert!(c.describe().contains("2 images"), "{}", c.describe());
        // Every truncation and byte flip is an error or a container, never a panic.
        for len in 0..all.len() {
            let _ = parse(&all[..len]);
        }
        for i in 0..all.len() {
            let mut m = all.clone();
            m[i] ^= 0xff;
            if let Err(e) = parse(&m) {
                assert!(matches!(e, Error::InvalidImage(_)), "{e}");
            }
        }
    }

    #[test]
    fn bundle_ids_split_into_kind_triple_and_target() {
        assert_eq!(
            bundle_id("openmp-amdgcn-amd-amdhsa--gfx90a:xnack+"),
            (
                "openmp".into(),
                "amdgcn-amd-amdhsa".into(),
                "gfx90a:xnack+".into()
            )
        );
        assert_eq!(
            bundle_id("host-x86_64-unknown-linux-gnu-"),
            (
                "host".into(),
                "x86_64-unknown-linux-gnu".into(),
                String::new()
            )
        );
        assert_eq!(
            bundle_id("openmp-x86_64-unknown-linux-gnu-sapphirerapids-"),
            (
                "openmp".into(),
                "x86_64-unknown-linux-gnu".into(),
                "sapphirerapids".into()
            )
        );
        assert_eq!(
            bundle_id("hip-amdgcn-amd-amdhsa"),
            ("hip".into(), "amdgcn-amd-amdhsa".into(), String::new())
        );
    }
}
