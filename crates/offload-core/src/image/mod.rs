//! Device image classification: native ELF (with the header fields a plugin routes on) versus
//! LLVM bitcode versus unknown bytes.
//!
//! Classification reads only the identification and file header, with bounds checks on every
//! field, so that a 32-bit or big-endian image still gets a precise "wrong class" answer instead
//! of a structural parse error. Plugins that load an image then call [`ElfImage::parse`], which
//! validates the whole structure (section and program headers, symbol tables) with the `object`
//! crate and lists the exported symbols.

pub mod bitcode;
pub mod container;
pub mod elf_dyn;
pub mod triple;

use crate::error::{Error, Result};
use object::read::elf::{ElfFile64, FileHeader, Sym};
use object::{Endianness, Object, ObjectSection, ObjectSymbol, SymbolKind};

/// The four bytes every ELF file starts with.
pub const ELF_MAGIC: [u8; 4] = [0x7f, b'E', b'L', b'F'];
/// Raw LLVM bitcode magic: `'B' 'C' 0xC0DE`.
pub const BITCODE_MAGIC: [u8; 4] = [b'B', b'C', 0xC0, 0xDE];
/// Bitcode wrapper header magic `0x0B17C0DE`, stored little-endian.
pub const BITCODE_WRAPPER_MAGIC: [u8; 4] = [0xDE, 0xC0, 0x17, 0x0B];

/// ELF machine numbers this project names (`e_machine`).
pub mod machine {
    /// `EM_386`
    pub const I386: u16 = 3;
    /// `EM_PPC64`
    pub const PPC64: u16 = 21;
    /// `EM_ARM`
    pub const ARM: u16 = 40;
    /// `EM_X86_64`
    pub const X86_64: u16 = 62;
    /// `EM_AARCH64`
    pub const AARCH64: u16 = 183;
    /// `EM_CUDA` (NVIDIA cubin)
    pub const CUDA: u16 = 190;
    /// `EM_INTELGT` (Intel GPU native binaries, "zebin")
    pub const INTELGT: u16 = 205;
    /// `EM_AMDGPU` (AMD code objects)
    pub const AMDGPU: u16 = 224;
    /// `EM_RISCV`
    pub const RISCV: u16 = 243;

    /// The ELF machine of the CPU this code was compiled for (the host plugin serves it).
    pub const fn host() -> u16 {
        if cfg!(target_arch = "x86_64") {
            X86_64
        } else if cfg!(target_arch = "aarch64") {
            AARCH64
        } else if cfg!(target_arch = "riscv64") {
            RISCV
        } else if cfg!(target_arch = "powerpc64") {
            PPC64
        } else {
            0
        }
    }

    /// A readable name for messages: `EM_X86_64 (62)`.
    pub fn describe(m: u16) -> String {
        let name = match m {
            0 => "EM_NONE",
            I386 => "EM_386",
            PPC64 => "EM_PPC64",
            ARM => "EM_ARM",
            X86_64 => "EM_X86_64",
            AARCH64 => "EM_AARCH64",
            CUDA => "EM_CUDA",
            INTELGT => "EM_INTELGT",
            AMDGPU => "EM_AMDGPU",
            RISCV => "EM_RISCV",
            _ => return format!("machine {m}"),
        };
        format!("{name} ({m})")
    }
}

/// ELF file class (`EI_CLASS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElfClass {
    /// `ELFCLASS32`
    Elf32,
    /// `ELFCLASS64`
    Elf64,
}

/// ELF data encoding (`EI_DATA`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElfEndian {
    /// `ELFDATA2LSB`
    Little,
    /// `ELFDATA2MSB`
    Big,
}

impl std::fmt::Display for ElfEndian {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ElfEndian::Little => "little-endian",
            ElfEndian::Big => "big-endian",
        })
    }
}

impl ElfEndian {
    /// The byte order of the CPU this code runs on.
    pub const fn host() -> Self {
        if cfg!(target_endian = "little") {
            ElfEndian::Little
        } else {
            ElfEndian::Big
        }
    }
}

/// ELF object file types (`e_type`).
pub mod elf_type {
    /// `ET_REL`: relocatable object (`.o`).
    pub const REL: u16 = 1;
    /// `ET_EXEC`: executable.
    pub const EXEC: u16 = 2;
    /// `ET_DYN`: shared object.
    pub const DYN: u16 = 3;
    /// `ET_CORE`: core dump.
    pub const CORE: u16 = 4;

    /// A readable name for messages.
    pub fn describe(t: u16) -> String {
        match t {
            0 => "ET_NONE (0)".into(),
            REL => "ET_REL (1, relocatable object)".into(),
            EXEC => "ET_EXEC (2, executable)".into(),
            DYN => "ET_DYN (3, shared object)".into(),
            CORE => "ET_CORE (4, core dump)".into(),
            t => format!("type {t}"),
        }
    }
}

/// The header fields of a native ELF image that routing and compatibility checks use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElfInfo {
    /// `EI_CLASS`
    pub class: ElfClass,
    /// `EI_DATA`
    pub endian: ElfEndian,
    /// `EI_OSABI`
    pub os_abi: u8,
    /// `e_type`
    pub file_type: u16,
    /// `e_machine`
    pub machine: u16,
    /// `e_flags` (AMDGPU encodes the gfx target here)
    pub flags: u32,
}

/// What kind of image a byte buffer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageKind {
    /// A native ELF image.
    Elf(ElfInfo),
    /// LLVM bitcode, raw or inside the bitcode wrapper header.
    Bitcode {
        /// True when the bytes start with the `0x0B17C0DE` wrapper.
        wrapped: bool,
    },
    /// Textual LLVM IR (what `clang -S -emit-llvm` writes).
    LlvmIr,
    /// PTX assembly text (NVIDIA's virtual ISA; the CUDA driver assembles it).
    Ptx,
    /// A CUDA fat binary (magic `0xBA55ED50`): cubins and PTX for several architectures.
    CudaFatbin,
    /// An LLVM offload binary (magic `0x10FF10AD`): what `clang-offload-packager` writes and
    /// clang's new offload driver embeds; several images, each with its triple and arch.
    OffloadBinary,
    /// A clang offload bundle (`__CLANG_OFFLOAD_BUNDLE__`): several images by bundle id.
    OffloadBundle,
    /// A SPIR-V module (magic `0x07230203`, little-endian words): the portable GPU IL that
    /// OpenCL and Level Zero drivers compile.
    SpirV,
}

/// Magic of an LLVM offload binary.
pub const OFFLOAD_BINARY_MAGIC: [u8; 4] = [0x10, 0xFF, 0x10, 0xAD];
/// Magic of a clang offload bundle.
pub const OFFLOAD_BUNDLE_MAGIC: &[u8; 24] = b"__CLANG_OFFLOAD_BUNDLE__";
/// Magic of a compressed clang offload bundle (`clang-offload-bundler -compress`).
pub const COMPRESSED_BUNDLE_MAGIC: &[u8; 4] = b"CCOB";
/// Magic of a CUDA fat binary, as stored (little-endian `0xBA55ED50`).
pub const CUDA_FATBIN_MAGIC: [u8; 4] = [0x50, 0xED, 0x55, 0xBA];
/// Magic of a SPIR-V module, as stored in little-endian words (`0x07230203`).
pub const SPIRV_MAGIC: [u8; 4] = [0x03, 0x02, 0x23, 0x07];

impl ImageKind {
    /// A short name for messages (`ELF`, `bitcode`, `PTX`, ...).
    pub fn describe(&self) -> &'static str {
        match self {
            ImageKind::Elf(_) => "ELF",
            ImageKind::Bitcode { .. } => "LLVM bitcode",
            ImageKind::LlvmIr => "LLVM IR",
            ImageKind::Ptx => "PTX",
            ImageKind::CudaFatbin => "CUDA fatbin",
            ImageKind::OffloadBinary => "LLVM offload binary",
            ImageKind::OffloadBundle => "clang offload bundle",
            ImageKind::SpirV => "SPIR-V module",
        }
    }

    /// Whether the JIT compiles this kind (bitcode or IR).
    pub fn is_jit_input(&self) -> bool {
        matches!(self, ImageKind::Bitcode { .. } | ImageKind::LlvmIr)
    }
}

/// Whether the bytes are PTX text: after blank lines and `//` or `/* */` comments, the first
/// directive is `.version`, as PTX requires.
pub fn looks_like_ptx(bytes: &[u8]) -> bool {
    let mut rest = bytes;
    loop {
        rest = rest.trim_ascii_start();
        if let Some(r) = rest.strip_prefix(b"//") {
            let end = r.iter().position(|&b| b == b'\n').unwrap_or(r.len());
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix(b"/*") {
            match r.windows(2).position(|w| w == b"*/") {
                Some(end) => rest = &r[end + 2..],
                None => return false,
            }
        } else {
            break;
        }
    }
    rest.strip_prefix(b".version")
        .is_some_and(|r| r.first().is_some_and(u8::is_ascii_whitespace))
}

/// Whether the bytes are textual LLVM IR, decided by the module's first top-level entity: after
/// whitespace and `;` comments, the text must start the way LLVM's parser accepts a top-level
/// entity (`source_filename`, `target`, `define`, `declare`, `attributes`, `module asm`,
/// `uselistorder`, a global `@x =`, a type `%t = type`, metadata `!x =`, a comdat `$c =`, a
/// summary entry `^0 =`). Comments and blank lines may be any length and in any encoding. LLVM
/// itself makes the final decision when it parses the module; this only has to agree with it
/// on what *starts* like IR.
///
/// A module with no top-level entity at all is valid IR too (`llc` compiles it to an empty
/// module; three of LLVM's own NVPTX CodeGen tests are such files): text of `;` comments and
/// blank lines only is IR when [`is_empty_llvm_module`] says so.
pub fn looks_like_llvm_ir(bytes: &[u8]) -> bool {
    let rest = skip_ir_comments(bytes);
    if rest.is_empty() {
        return is_empty_llvm_module(bytes);
    }
    let word_end = |r: &[u8]| {
        r.iter()
            .position(|&b| !(b.is_ascii_alphanumeric() || b == b'_'))
            .unwrap_or(r.len())
    };
    let keyword = &rest[..word_end(rest)];
    let after = rest[keyword.len()..].trim_ascii_start();
    match keyword {
        b"source_filename" | b"attributes" => after.starts_with(b"="),
        b"target" => after.starts_with(b"triple") || after.starts_with(b"datalayout"),
        b"module" => after.starts_with(b"asm"),
        b"define" | b"declare" | b"uselistorder" | b"uselistorder_bb" | b"deplibs" => true,
        _ => {
            // `@name =`, `%name = type`, `!name =`, `$name =`, `^N =`, with quoted names allowed.
            let Some((&sigil, name)) = rest.split_first() else {
                return false;
            };
            if !matches!(sigil, b'@' | b'%' | b'!' | b'$' | b'^') {
                return false;
            }
            let name_len = if name.first() == Some(&b'"') {
                match name[1..].iter().position(|&b| b == b'"') {
                    Some(p) => p + 2,
                    None => return false,
                }
            } else {
                name.iter()
                    .position(|&b| !(b.is_ascii_alphanumeric() || b"._$-".contains(&b)))
                    .unwrap_or(name.len())
            };
            if name_len == 0 {
                return false;
            }
            let after = name[name_len..].trim_ascii_start();
            let Some(value) = after.strip_prefix(b"=") else {
                return false;
            };
            sigil != b'%' || value.trim_ascii_start().starts_with(b"type")
        }
    }
}

/// What follows the leading whitespace and `;` comments of IR text.
fn skip_ir_comments(bytes: &[u8]) -> &[u8] {
    let mut rest = bytes;
    loop {
        rest = rest.trim_ascii_start();
        match rest.first() {
            Some(b';') => {
                let end = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
                rest = &rest[end..];
            }
            _ => return rest,
        }
    }
}

/// Whether the bytes are an LLVM IR module with no top-level entities: at least one `;`
/// comment, nothing but comments and whitespace, and text (no NUL or other control byte
/// besides tab, line feed, vertical tab, form feed and carriage return), so that binary data
/// that happens to start with `;` is not taken for a module. Such a module has no target
/// triple: it is compiled for whichever target it is asked for, and the runtime cannot route
/// it by itself.
pub fn is_empty_llvm_module(bytes: &[u8]) -> bool {
    skip_ir_comments(bytes).is_empty()
        && bytes.trim_ascii_start().first() == Some(&b';')
        && bytes
            .iter()
            .all(|&b| b >= 0x20 || matches!(b, b'\t' | b'\n' | 0x0b | 0x0c | b'\r'))
        && !bytes.contains(&0x7f)
}

fn read_u16(bytes: &[u8], at: usize, endian: ElfEndian) -> u16 {
    let b = [bytes[at], bytes[at + 1]];
    match endian {
        ElfEndian::Little => u16::from_le_bytes(b),
        ElfEndian::Big => u16::from_be_bytes(b),
    }
}

fn read_u32(bytes: &[u8], at: usize, endian: ElfEndian) -> u32 {
    let b = [bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]];
    match endian {
        ElfEndian::Little => u32::from_le_bytes(b),
        ElfEndian::Big => u32::from_be_bytes(b),
    }
}

fn hex_prefix(bytes: &[u8]) -> String {
    bytes
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Classifies an image by its first bytes. Every malformed input gets an
/// [`Error::InvalidImage`] that says which byte or field is wrong.
pub fn classify(bytes: &[u8]) -> Result<ImageKind> {
    if bytes.is_empty() {
        return Err(Error::InvalidImage("image is empty (0 bytes)".into()));
    }
    if bytes.len() >= 4 && bytes[..4] == BITCODE_MAGIC {
        return Ok(ImageKind::Bitcode { wrapped: false });
    }
    if bytes.len() >= 4 && bytes[..4] == BITCODE_WRAPPER_MAGIC {
        // Wrapper: magic, version, offset, size, cputype (5 x u32), then raw bitcode at offset.
        if bytes.len() < 20 {
            return Err(Error::InvalidImage(format!(
                "truncated bitcode wrapper: {} bytes, the wrapper header needs 20",
                bytes.len()
            )));
        }
        let offset = read_u32(bytes, 8, ElfEndian::Little) as usize;
        let size = read_u32(bytes, 12, ElfEndian::Little) as usize;
        let end = offset.checked_add(size);
        if end.is_none_or(|end| end > bytes.len()) {
            return Err(Error::InvalidImage(format!(
                "bitcode wrapper says the bitcode is at offset {offset}, {size} bytes, \
                 but the image has {} bytes",
                bytes.len()
            )));
        }
        if bytes.len() < offset + 4 || bytes[offset..offset + 4] != BITCODE_MAGIC {
            return Err(Error::InvalidImage(format!(
                "bitcode wrapper points at offset {offset}, which does not hold bitcode magic 'BC' c0 de"
            )));
        }
        return Ok(ImageKind::Bitcode { wrapped: true });
    }
    if bytes.starts_with(&OFFLOAD_BINARY_MAGIC) {
        return Ok(ImageKind::OffloadBinary);
    }
    if bytes.starts_with(OFFLOAD_BUNDLE_MAGIC) {
        return Ok(ImageKind::OffloadBundle);
    }
    if bytes.starts_with(COMPRESSED_BUNDLE_MAGIC) {
        return Err(Error::InvalidImage(
            "compressed clang offload bundle (magic 'CCOB'): not supported; bundle without \
             -compress, or unbundle it with clang-offload-bundler -unbundle"
                .into(),
        ));
    }
    if bytes.starts_with(&CUDA_FATBIN_MAGIC) {
        return Ok(ImageKind::CudaFatbin);
    }
    if bytes.starts_with(&SPIRV_MAGIC) {
        return Ok(ImageKind::SpirV);
    }
    if bytes.starts_with(&[0x07, 0x23, 0x02, 0x03]) {
        return Err(Error::InvalidImage(
            "a SPIR-V module in big-endian words (magic 07 23 02 03): drivers take little-endian \
             modules; byte-swap each 4-byte word"
                .into(),
        ));
    }
    if bytes.len() < 4 || bytes[..4] != ELF_MAGIC {
        if looks_like_llvm_ir(bytes) {
            return Ok(ImageKind::LlvmIr);
        }
        if looks_like_ptx(bytes) {
            return Ok(ImageKind::Ptx);
        }
        return Err(Error::InvalidImage(format!(
            "unknown image format: first bytes are [{}], expected ELF (7f 45 4c 46), LLVM bitcode \
             (42 43 c0 de, or wrapper de c0 17 0b), textual LLVM IR, PTX text, a CUDA fatbin \
             (50 ed 55 ba), a SPIR-V module (03 02 23 07), an LLVM offload binary (10 ff 10 ad) \
             or a clang offload bundle",
            hex_prefix(bytes)
        )));
    }
    if bytes.len() < 16 {
        return Err(Error::InvalidImage(format!(
            "truncated ELF: {} bytes, the ELF identification alone needs 16",
            bytes.len()
        )));
    }
    let class = match bytes[4] {
        1 => ElfClass::Elf32,
        2 => ElfClass::Elf64,
        c => {
            return Err(Error::InvalidImage(format!(
                "invalid ELF class byte EI_CLASS (offset 4) = {c}, expected 1 (ELFCLASS32) or 2 (ELFCLASS64)"
            )));
        }
    };
    let endian = match bytes[5] {
        1 => ElfEndian::Little,
        2 => ElfEndian::Big,
        d => {
            return Err(Error::InvalidImage(format!(
                "invalid ELF data encoding byte EI_DATA (offset 5) = {d}, expected 1 (little-endian) or 2 (big-endian)"
            )));
        }
    };
    if bytes[6] != 1 {
        return Err(Error::InvalidImage(format!(
            "invalid ELF version byte EI_VERSION (offset 6) = {}, expected 1",
            bytes[6]
        )));
    }
    let header_len = match class {
        ElfClass::Elf32 => 52,
        ElfClass::Elf64 => 64,
    };
    if bytes.len() < header_len {
        return Err(Error::InvalidImage(format!(
            "truncated ELF: {} bytes, the {} file header needs {header_len}",
            bytes.len(),
            match class {
                ElfClass::Elf32 => "ELF32",
                ElfClass::Elf64 => "ELF64",
            }
        )));
    }
    let flags_at = match class {
        ElfClass::Elf32 => 36,
        ElfClass::Elf64 => 48,
    };
    Ok(ImageKind::Elf(ElfInfo {
        class,
        endian,
        os_abi: bytes[7],
        file_type: read_u16(bytes, 16, endian),
        machine: read_u16(bytes, 18, endian),
        flags: read_u32(bytes, flags_at, endian),
    }))
}

/// What a plugin requires of a native image before it parses it.
#[derive(Debug, Clone, Copy)]
pub struct ElfRequirements<'a> {
    /// Name of the plugin, for messages.
    pub plugin: &'a str,
    /// The ELF machine the plugin serves.
    pub machine: u16,
    /// Accepted `e_type` values.
    pub file_types: &'a [u16],
}

impl ElfInfo {
    /// Checks that the image is 64-bit and in the host's byte order (what every plugin here
    /// reads). The error names the field and both values.
    pub fn require_layout(&self, plugin: &str) -> Result<()> {
        if self.class != ElfClass::Elf64 {
            return Err(Error::InvalidImage(format!(
                "ELF class is ELFCLASS32 (EI_CLASS, offset 4); the {plugin} plugin loads only ELFCLASS64 images"
            )));
        }
        if self.endian != ElfEndian::host() {
            return Err(Error::InvalidImage(format!(
                "ELF data encoding is {} (EI_DATA, offset 5); the {plugin} plugin needs {}",
                self.endian,
                ElfEndian::host()
            )));
        }
        Ok(())
    }

    /// Checks the header against a plugin's requirements: 64-bit, host byte order, machine and
    /// type. The error names the field and both values.
    pub fn require(&self, req: &ElfRequirements<'_>) -> Result<()> {
        self.require_layout(req.plugin)?;
        if self.machine != req.machine {
            return Err(Error::InvalidImage(format!(
                "ELF machine is {} (e_machine, offset 18); the {} plugin serves {}",
                machine::describe(self.machine),
                req.plugin,
                machine::describe(req.machine)
            )));
        }
        if !req.file_types.contains(&self.file_type) {
            let wanted: Vec<String> = req
                .file_types
                .iter()
                .map(|t| elf_type::describe(*t))
                .collect();
            return Err(Error::InvalidImage(format!(
                "ELF type is {} (e_type, offset 16); the {} plugin loads only {}",
                elf_type::describe(self.file_type),
                req.plugin,
                wanted.join(" or ")
            )));
        }
        Ok(())
    }
}

/// A symbol a loaded image exports (from `.dynsym`, or `.symtab` when there is no dynamic
/// symbol table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportedSymbol {
    /// Symbol name.
    pub name: String,
    /// True for functions (kernel candidates), false for data objects (globals).
    pub is_function: bool,
    /// `st_value`
    pub address: u64,
    /// `st_size`
    pub size: u64,
}

/// Bytes at an 8-byte aligned address, as `object` needs to read ELF headers in place: the
/// bytes themselves when they are aligned, else an aligned copy (an image embedded with
/// `include_bytes!` or sliced out of a larger file may not be). Offsets are the same in both.
#[derive(Debug)]
pub struct Aligned<'a> {
    bytes: &'a [u8],
    copy: Option<Vec<u64>>,
}

impl<'a> Aligned<'a> {
    /// `bytes`, aligned.
    pub fn new(bytes: &'a [u8]) -> Self {
        if bytes.as_ptr().align_offset(8) == 0 {
            return Aligned { bytes, copy: None };
        }
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        // SAFETY: `words` owns at least `bytes.len()` bytes; u64 has no invalid bit patterns.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                words.as_mut_ptr().cast::<u8>(),
                bytes.len(),
            );
        }
        Aligned {
            bytes,
            copy: Some(words),
        }
    }

    /// The aligned bytes.
    pub fn bytes(&self) -> &[u8] {
        match &self.copy {
            // SAFETY: the first `bytes.len()` bytes of `words` were initialised from `bytes`.
            Some(words) => unsafe {
                std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), self.bytes.len())
            },
            None => self.bytes,
        }
    }
}

/// A structurally validated 64-bit ELF image in host byte order, with its exported symbols.
#[derive(Debug, Clone)]
pub struct ElfImage {
    /// The header fields.
    pub info: ElfInfo,
    /// Defined, globally visible function and data symbols.
    pub symbols: Vec<ExportedSymbol>,
    /// Names of the undefined, non-weak dynamic symbols: what the image takes from the
    /// libraries of the process that loads it.
    pub imports: Vec<String>,
}

impl ElfImage {
    /// Classifies, checks the header against `req`, and parses the whole ELF structure.
    pub fn parse(bytes: &[u8], req: &ElfRequirements<'_>) -> Result<Self> {
        Self::parse_as(bytes, &classify(bytes)?, req)
    }

    /// As [`ElfImage::parse`], for bytes already classified as `kind` (the layer classifies an
    /// image once and hands its kind to the hooks): checks the header against `req` and parses
    /// the whole ELF structure.
    pub fn parse_as(bytes: &[u8], kind: &ImageKind, req: &ElfRequirements<'_>) -> Result<Self> {
        let info = match *kind {
            ImageKind::Elf(info) => info,
            ImageKind::Bitcode { .. } | ImageKind::LlvmIr => {
                return Err(Error::InvalidImage(format!(
                    "image is LLVM bitcode/IR; the {} plugin has no JIT engine and loads only native ELF",
                    req.plugin
                )));
            }
            other => {
                return Err(Error::InvalidImage(format!(
                    "image is a {}; the {} plugin loads native ELF here",
                    other.describe(),
                    req.plugin
                )));
            }
        };
        info.require(req)?;
        let aligned = Aligned::new(bytes);
        let bytes = aligned.bytes();
        let file = ElfFile64::<Endianness>::parse(bytes).map_err(|e| {
            Error::InvalidImage(format!("malformed ELF64 ({} bytes): {e}", bytes.len()))
        })?;
        // `object` checks the section header table lazily; walk it now so that a truncated
        // image fails here and not halfway through loading.
        for section in file.sections() {
            section.data().map_err(|e| {
                Error::InvalidImage(format!(
                    "malformed ELF64 ({} bytes): section {} ({}): {e}",
                    bytes.len(),
                    section.index().0,
                    section.name().unwrap_or("?")
                ))
            })?;
        }
        let endian = file.endian();
        let header = file.elf_header();
        let ph_end = header.e_phoff(endian).saturating_add(
            u64::from(header.e_phnum(endian)) * u64::from(header.e_phentsize(endian)),
        );
        if ph_end > bytes.len() as u64 {
            return Err(Error::InvalidImage(format!(
                "truncated ELF64: program header table ends at byte {ph_end}, image has {} bytes",
                bytes.len()
            )));
        }
        let mut symbols = Vec::new();
        let dynamic: Vec<_> = file.dynamic_symbols().collect();
        let table: Box<dyn Iterator<Item = _>> = if dynamic.is_empty() {
            Box::new(file.symbols())
        } else {
            Box::new(dynamic.into_iter())
        };
        let mut imports = Vec::new();
        for sym in table {
            if sym.is_undefined() && !sym.is_weak() && sym.index().0 != 0 {
                if let Ok(name) = sym.name()
                    && !name.is_empty()
                {
                    imports.push(name.to_string());
                }
                continue;
            }
            if sym.is_undefined() || !sym.is_global() {
                continue;
            }
            let is_function = match sym.kind() {
                SymbolKind::Text => true,
                SymbolKind::Data => false,
                _ => continue,
            };
            let elf_sym = sym.elf_symbol();
            // Hidden/internal symbols cannot be looked up by the dynamic loader.
            let visibility = elf_sym.st_other() & 0x3;
            if visibility == object::elf::STV_HIDDEN || visibility == object::elf::STV_INTERNAL {
                continue;
            }
            let name = sym.name().map_err(|e| {
                Error::InvalidImage(format!(
                    "malformed ELF64: symbol {} has an unreadable name: {e}",
                    sym.index().0
                ))
            })?;
            symbols.push(ExportedSymbol {
                name: name.to_string(),
                is_function,
                address: sym.address(),
                size: sym.size(),
            });
        }
        Ok(ElfImage {
            info,
            symbols,
            imports,
        })
    }

    /// Finds an exported symbol by name.
    pub fn symbol(&self, name: &str) -> Option<&ExportedSymbol> {
        self.symbols.iter().find(|s| s.name == name)
    }

    /// Names of the exported functions, for "did you mean" style errors.
    pub fn function_names(&self) -> Vec<&str> {
        self.symbols
            .iter()
            .filter(|s| s.is_function)
            .map(|s| s.name.as_str())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elf64_header(machine: u16, file_type: u16) -> Vec<u8> {
        let mut h = vec![0u8; 64];
        h[..4].copy_from_slice(&ELF_MAGIC);
        h[4] = 2;
        h[5] = 1;
        h[6] = 1;
        h[16..18].copy_from_slice(&file_type.to_le_bytes());
        h[18..20].copy_from_slice(&machine.to_le_bytes());
        h[48..52].copy_from_slice(&0x1234u32.to_le_bytes());
        h
    }

    #[test]
    fn classifies_elf_header_fields() {
        let h = elf64_header(machine::AMDGPU, elf_type::DYN);
        let ImageKind::Elf(info) = classify(&h).unwrap() else {
            panic!("not ELF")
        };
        assert_eq!(info.class, ElfClass::Elf64);
        assert_eq!(info.endian, ElfEndian::Little);
        assert_eq!(info.machine, machine::AMDGPU);
        assert_eq!(info.file_type, elf_type::DYN);
        assert_eq!(info.flags, 0x1234);
    }

    #[test]
    fn classifies_bitcode_raw_and_wrapped() {
        assert_eq!(
            classify(b"BC\xc0\xde\x35\x14").unwrap(),
            ImageKind::Bitcode { wrapped: false }
        );
        let mut w = vec![0xde, 0xc0, 0x17, 0x0b, 0, 0, 0, 0];
        w.extend_from_slice(&20u32.to_le_bytes());
        w.extend_from_slice(&4u32.to_le_bytes());
        w.extend_from_slice(&[0; 4]);
        w.extend_from_slice(b"BC\xc0\xde");
        assert_eq!(classify(&w).unwrap(), ImageKind::Bitcode { wrapped: true });
        assert_eq!(
            classify(b"; ModuleID = 'k.c'\nsource_filename = \"k.c\"\n").unwrap(),
            ImageKind::LlvmIr
        );
        assert_eq!(
            classify(b"target triple = \"x86_64-unknown-linux-gnu\"\n").unwrap(),
            ImageKind::LlvmIr
        );
        w.truncate(22);
        let e = classify(&w).unwrap_err().to_string();
        assert!(e.contains("offset 20"), "{e}");
    }

    #[test]
    fn malformed_inputs_name_the_problem() {
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![], "empty"),
            (b"hello world".to_vec(), "unknown image format"),
            (ELF_MAGIC.to_vec(), "truncated ELF: 4 bytes"),
            (
                elf64_header(62, 3)[..40].to_vec(),
                "ELF64 file header needs 64",
            ),
            (
                {
                    let mut h = elf64_header(62, 3);
                    h[4] = 9;
                    h
                },
                "EI_CLASS (offset 4) = 9",
            ),
            (
                {
                    let mut h = elf64_header(62, 3);
                    h[5] = 0;
                    h
                },
                "EI_DATA (offset 5) = 0",
            ),
            (
                {
                    let mut h = elf64_header(62, 3);
                    h[6] = 2;
                    h
                },
                "EI_VERSION (offset 6) = 2",
            ),
        ];
        for (bytes, want) in cases {
            let e = classify(&bytes).unwrap_err();
            assert!(matches!(e, Error::InvalidImage(_)), "{e}");
            assert!(e.to_string().contains(want), "{e} should contain {want}");
        }
    }

    #[test]
    fn requirements_name_the_field() {
        let req = ElfRequirements {
            plugin: "host",
            machine: machine::X86_64,
            file_types: &[elf_type::DYN],
        };
        let info = |m, t| match classify(&elf64_header(m, t)).unwrap() {
            ImageKind::Elf(i) => i,
            _ => unreachable!(),
        };
        let e = info(machine::AMDGPU, elf_type::DYN)
            .require(&req)
            .unwrap_err();
        assert!(e.to_string().contains("EM_AMDGPU (224)"), "{e}");
        let e = info(machine::X86_64, elf_type::REL)
            .require(&req)
            .unwrap_err();
        assert!(e.to_string().contains("ET_REL"), "{e}");
        let mut i = info(machine::X86_64, elf_type::DYN);
        i.class = ElfClass::Elf32;
        assert!(
            i.require(&req)
                .unwrap_err()
                .to_string()
                .contains("ELFCLASS32")
        );
    }
}
