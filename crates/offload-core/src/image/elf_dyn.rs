//! What a dynamic loader trusts in a 64-bit little-endian ELF image, checked before it is
//! handed to one: the program headers (in range, aligned, ordered), the dynamic section, and
//! everything it points to (string, symbol, hash and version tables, relocations, initialiser
//! arrays), all in range, aligned and consistent. glibc's loader reads these structures without
//! checks of its own, so a damaged image crashes it (or trips its assertions) inside `dlopen`;
//! here each problem is an error that names the structure and the field.
//!
//! The code of an image is not (and cannot be) checked: an image is code that runs in the
//! process. See the trust model in `docs/design.md`.

use crate::error::{Error, Result};

/// `PT_LOAD`
const PT_LOAD: u32 = 1;
/// `PT_DYNAMIC`
const PT_DYNAMIC: u32 = 2;
/// `PT_INTERP`
const PT_INTERP: u32 = 3;
/// `PT_NOTE`
const PT_NOTE: u32 = 4;
/// `PT_TLS`
const PT_TLS: u32 = 7;
/// `PT_GNU_RELRO`
const PT_GNU_RELRO: u32 = 0x6474_e552;
/// `PF_X`
const PF_X: u32 = 1;
/// `PF_W`
const PF_W: u32 = 2;

/// The loadable segments of an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// `p_vaddr`
    pub vaddr: u64,
    /// `p_memsz`
    pub memsz: u64,
    /// `p_offset`
    pub offset: u64,
    /// `p_filesz`
    pub filesz: u64,
    /// `PF_W`
    pub writable: bool,
    /// `PF_X`
    pub executable: bool,
}

impl Segment {
    fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.vaddr
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.vaddr + self.memsz)
    }
}

/// The layout [`validate`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Layout {
    /// `PT_LOAD` segments, in address order.
    pub segments: Vec<Segment>,
    /// Whether the image has a dynamic section.
    pub dynamic: bool,
}

impl Layout {
    /// Whether `addr..addr+len` lies in one writable segment.
    pub fn is_writable(&self, addr: u64, len: u64) -> bool {
        self.segments
            .iter()
            .any(|s| s.writable && s.contains(addr, len))
    }

    /// Whether `addr` lies in an executable segment.
    pub fn is_executable(&self, addr: u64) -> bool {
        self.segments
            .iter()
            .any(|s| s.executable && s.contains(addr, 1))
    }

    fn segment_of(&self, addr: u64, len: u64) -> Option<&Segment> {
        self.segments.iter().find(|s| s.contains(addr, len))
    }

    /// The file offset of `addr..addr+len`, which must lie in the file-backed part of one
    /// segment.
    fn file_offset(&self, addr: u64, len: u64) -> Option<u64> {
        self.segments.iter().find_map(|s| {
            let end = addr.checked_add(len)?;
            (addr >= s.vaddr && end <= s.vaddr + s.filesz).then(|| s.offset + (addr - s.vaddr))
        })
    }
}

fn bad(what: impl std::fmt::Display) -> Error {
    Error::InvalidImage(format!("malformed ELF64 dynamic image: {what}"))
}

struct Reader<'a> {
    b: &'a [u8],
}

impl Reader<'_> {
    fn bytes(&self, at: u64, len: u64, what: &str) -> Result<&[u8]> {
        let end = at
            .checked_add(len)
            .filter(|e| *e <= self.b.len() as u64)
            .ok_or_else(|| {
                bad(format!(
                    "{what}: bytes {at}..{} lie past the end of the {}-byte image",
                    at.saturating_add(len),
                    self.b.len()
                ))
            })?;
        Ok(&self.b[at as usize..end as usize])
    }
    fn u16(&self, at: u64) -> u16 {
        u16::from_le_bytes(self.b[at as usize..at as usize + 2].try_into().expect("2"))
    }
    fn u32(&self, at: u64) -> u32 {
        u32::from_le_bytes(self.b[at as usize..at as usize + 4].try_into().expect("4"))
    }
    fn u64(&self, at: u64) -> u64 {
        u64::from_le_bytes(self.b[at as usize..at as usize + 8].try_into().expect("8"))
    }
}

/// The dynamic entries the checks use (`None`: absent).
#[derive(Default)]
struct Dynamic {
    strtab: Option<u64>,
    strsz: Option<u64>,
    symtab: Option<u64>,
    syment: Option<u64>,
    hash: Option<u64>,
    gnu_hash: Option<u64>,
    rela: Option<u64>,
    relasz: Option<u64>,
    relaent: Option<u64>,
    jmprel: Option<u64>,
    pltrelsz: Option<u64>,
    pltrel: Option<u64>,
    relacount: Option<u64>,
    relr: Option<u64>,
    relrsz: Option<u64>,
    relrent: Option<u64>,
    init: Option<u64>,
    fini: Option<u64>,
    arrays: Vec<(&'static str, Option<u64>, Option<u64>)>,
    versym: Option<u64>,
    verdef: Option<u64>,
    verdefnum: Option<u64>,
    verneed: Option<u64>,
    verneednum: Option<u64>,
    textrel: bool,
    strings: Vec<(&'static str, u64)>,
    rel: bool,
}

/// Relocation types glibc applies for this machine; `None`: any (not checked).
fn known_relocations(machine: u16) -> Option<&'static [u32]> {
    match machine {
        // R_X86_64_NONE, 64, PC32, GLOB_DAT, JUMP_SLOT, RELATIVE, 32, 32S, DTPMOD64, DTPOFF64,
        // TPOFF64, TLSDESC, IRELATIVE, RELATIVE64
        62 => Some(&[0, 1, 2, 6, 7, 8, 10, 11, 16, 17, 18, 36, 37, 38]),
        // R_AARCH64_NONE, ABS64, COPY excluded; GLOB_DAT, JUMP_SLOT, RELATIVE, TLS_DTPMOD,
        // TLS_DTPREL, TLS_TPREL, TLSDESC, IRELATIVE
        183 => Some(&[0, 257, 1025, 1026, 1027, 1028, 1029, 1030, 1031, 1032]),
        // R_AMDGPU_NONE .. R_AMDGPU_RELATIVE64 (ROCr's loader)
        224 => Some(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14]),
        _ => None,
    }
}

/// Checks what a dynamic loader trusts in `bytes` (ELF64, little-endian; the header fields
/// `classify` reads have been checked) and returns its layout.
pub fn validate(bytes: &[u8]) -> Result<Layout> {
    let r = Reader { b: bytes };
    if bytes.len() < 64 {
        return Err(bad(format!(
            "{} bytes, the ELF header needs 64",
            bytes.len()
        )));
    }
    let machine = r.u16(18);
    let phoff = r.u64(32);
    let ehsize = r.u16(52);
    let phentsize = r.u16(54);
    let phnum = r.u16(56);
    if ehsize != 64 {
        return Err(bad(format!("e_ehsize (offset 52) is {ehsize}, not 64")));
    }
    if phnum == 0 {
        return Ok(Layout::default());
    }
    if phentsize != 56 {
        return Err(bad(format!(
            "e_phentsize (offset 54) is {phentsize}, not 56"
        )));
    }
    if phoff % 8 != 0 {
        return Err(bad(format!(
            "e_phoff (offset 32) = {phoff} is not 8-byte aligned"
        )));
    }
    r.bytes(
        phoff,
        u64::from(phnum) * 56,
        "the program header table (e_phoff, e_phnum)",
    )?;

    let mut layout = Layout::default();
    let mut dynamic: Option<(u64, u64, u64)> = None;
    let mut relro: Option<(u64, u64)> = None;
    for i in 0..u64::from(phnum) {
        let at = phoff + i * 56;
        let (ptype, flags) = (r.u32(at), r.u32(at + 4));
        let (offset, vaddr, filesz, memsz, align) = (
            r.u64(at + 8),
            r.u64(at + 16),
            r.u64(at + 32),
            r.u64(at + 40),
            r.u64(at + 48),
        );
        let name = |field: &str| format!("program header {i} (type {ptype:#x}): {field}");
        if !matches!(
            ptype,
            PT_LOAD | PT_DYNAMIC | PT_TLS | PT_NOTE | PT_GNU_RELRO
        ) {
            continue;
        }
        if ptype != PT_GNU_RELRO {
            r.bytes(offset, filesz, &name("p_offset + p_filesz"))?;
        }
        if filesz > memsz {
            return Err(bad(name(&format!(
                "p_filesz {filesz} is larger than p_memsz {memsz}"
            ))));
        }
        if vaddr.checked_add(memsz).is_none_or(|e| e > 1 << 47) {
            return Err(bad(name(&format!(
                "p_vaddr {vaddr:#x} + p_memsz {memsz:#x} is beyond the address space"
            ))));
        }
        match ptype {
            PT_LOAD => {
                if align > 1 && (!align.is_power_of_two() || vaddr % align != offset % align) {
                    return Err(bad(name(&format!(
                        "p_align {align:#x} is not a power of two dividing p_vaddr - p_offset"
                    ))));
                }
                if vaddr % 4096 != offset % 4096 {
                    return Err(bad(name(&format!(
                        "p_vaddr {vaddr:#x} and p_offset {offset:#x} differ within a page"
                    ))));
                }
                if let Some(last) = layout.segments.last()
                    && vaddr < last.vaddr + last.memsz
                {
                    return Err(bad(name(&format!(
                        "PT_LOAD at {vaddr:#x} overlaps or precedes the one before it (they must be in address order)"
                    ))));
                }
                layout.segments.push(Segment {
                    vaddr,
                    memsz,
                    offset,
                    filesz,
                    writable: flags & PF_W != 0,
                    executable: flags & PF_X != 0,
                });
            }
            PT_DYNAMIC => {
                if dynamic.is_some() {
                    return Err(bad(name("a second PT_DYNAMIC")));
                }
                if filesz % 16 != 0 || offset % 8 != 0 {
                    return Err(bad(name(&format!(
                        "p_filesz {filesz} is not a whole number of 16-byte entries, or p_offset {offset} is unaligned"
                    ))));
                }
                dynamic = Some((offset, vaddr, filesz));
            }
            PT_TLS if align > 1 && !align.is_power_of_two() => {
                return Err(bad(name(&format!(
                    "p_align {align:#x} is not a power of two"
                ))));
            }
            PT_GNU_RELRO => relro = Some((vaddr, memsz)),
            _ => {}
        }
    }
    let _ = PT_INTERP;
    if layout.segments.is_empty() {
        return Err(bad("no PT_LOAD segment"));
    }
    if let Some((vaddr, memsz)) = relro
        && memsz > 0
        && layout.segment_of(vaddr, memsz).is_none()
    {
        return Err(bad(format!(
            "PT_GNU_RELRO {vaddr:#x}..{:#x} is not inside one PT_LOAD segment",
            vaddr + memsz
        )));
    }
    let Some((dyn_off, dyn_vaddr, dyn_size)) = dynamic else {
        return Ok(layout);
    };
    layout.dynamic = true;
    if layout.file_offset(dyn_vaddr, dyn_size) != Some(dyn_off) {
        return Err(bad(format!(
            "PT_DYNAMIC at {dyn_vaddr:#x} (file offset {dyn_off}) is not the file-backed part of a PT_LOAD segment at that offset"
        )));
    }
    let d = read_dynamic(&r, dyn_off, dyn_size)?;
    check_dynamic(&r, &layout, &d, machine)?;
    Ok(layout)
}

fn read_dynamic(r: &Reader<'_>, off: u64, size: u64) -> Result<Dynamic> {
    let mut d = Dynamic::default();
    let mut init_array = (None, None);
    let mut fini_array = (None, None);
    let mut preinit_array = (None, None);
    let mut ended = false;
    for i in 0..size / 16 {
        let at = off + i * 16;
        let (tag, val) = (r.u64(at), r.u64(at + 8));
        let set = |slot: &mut Option<u64>, name: &str| -> Result<()> {
            if slot.is_some() {
                return Err(bad(format!("dynamic entry {i}: a second {name}")));
            }
            *slot = Some(val);
            Ok(())
        };
        match tag {
            0 => {
                ended = true;
                break;
            }
            1 => d.strings.push(("DT_NEEDED", val)),
            2 => set(&mut d.pltrelsz, "DT_PLTRELSZ")?,
            4 => set(&mut d.hash, "DT_HASH")?,
            5 => set(&mut d.strtab, "DT_STRTAB")?,
            6 => set(&mut d.symtab, "DT_SYMTAB")?,
            7 => set(&mut d.rela, "DT_RELA")?,
            8 => set(&mut d.relasz, "DT_RELASZ")?,
            9 => set(&mut d.relaent, "DT_RELAENT")?,
            10 => set(&mut d.strsz, "DT_STRSZ")?,
            11 => set(&mut d.syment, "DT_SYMENT")?,
            12 => set(&mut d.init, "DT_INIT")?,
            13 => set(&mut d.fini, "DT_FINI")?,
            14 => d.strings.push(("DT_SONAME", val)),
            15 => d.strings.push(("DT_RPATH", val)),
            17..=19 => d.rel = true,
            20 => set(&mut d.pltrel, "DT_PLTREL")?,
            22 => d.textrel = true,
            23 => set(&mut d.jmprel, "DT_JMPREL")?,
            25 => set(&mut init_array.0, "DT_INIT_ARRAY")?,
            26 => set(&mut fini_array.0, "DT_FINI_ARRAY")?,
            27 => set(&mut init_array.1, "DT_INIT_ARRAYSZ")?,
            28 => set(&mut fini_array.1, "DT_FINI_ARRAYSZ")?,
            29 => d.strings.push(("DT_RUNPATH", val)),
            30 => d.textrel |= val & 0x4 != 0, // DF_TEXTREL
            32 => set(&mut preinit_array.0, "DT_PREINIT_ARRAY")?,
            33 => set(&mut preinit_array.1, "DT_PREINIT_ARRAYSZ")?,
            35 => set(&mut d.relrsz, "DT_RELRSZ")?,
            36 => set(&mut d.relr, "DT_RELR")?,
            37 => set(&mut d.relrent, "DT_RELRENT")?,
            0x6fff_fef5 => set(&mut d.gnu_hash, "DT_GNU_HASH")?,
            0x6fff_fff9 => set(&mut d.relacount, "DT_RELACOUNT")?,
            0x6fff_fff0 => set(&mut d.versym, "DT_VERSYM")?,
            0x6fff_fffc => set(&mut d.verdef, "DT_VERDEF")?,
            0x6fff_fffd => set(&mut d.verdefnum, "DT_VERDEFNUM")?,
            0x6fff_fffe => set(&mut d.verneed, "DT_VERNEED")?,
            0x6fff_ffff => set(&mut d.verneednum, "DT_VERNEEDNUM")?,
            _ => {}
        }
    }
    if !ended {
        return Err(bad("the dynamic section has no DT_NULL entry"));
    }
    d.arrays = vec![
        ("DT_INIT_ARRAY", init_array.0, init_array.1),
        ("DT_FINI_ARRAY", fini_array.0, fini_array.1),
        ("DT_PREINIT_ARRAY", preinit_array.0, preinit_array.1),
    ];
    Ok(d)
}

/// The file bytes of the table at `addr` of `len` bytes, which must be file-backed.
fn table<'a>(r: &'a Reader<'_>, l: &Layout, addr: u64, len: u64, what: &str) -> Result<&'a [u8]> {
    let off = l.file_offset(addr, len).ok_or_else(|| {
        bad(format!(
            "{what} at {addr:#x} ({len} bytes) is not in the file-backed part of a PT_LOAD segment"
        ))
    })?;
    r.bytes(off, len, what)
}

fn check_dynamic(r: &Reader<'_>, l: &Layout, d: &Dynamic, machine: u16) -> Result<()> {
    if d.rel {
        return Err(bad(
            "DT_REL relocations (this loader's 64-bit targets use DT_RELA)",
        ));
    }
    // Strings.
    let (strtab, strsz) = match (d.strtab, d.strsz) {
        (Some(t), Some(s)) => (t, s),
        (None, None) if d.symtab.is_none() && d.strings.is_empty() => (0, 0),
        _ => {
            return Err(bad(
                "DT_STRTAB and DT_STRSZ must come together (and with DT_SYMTAB)",
            ));
        }
    };
    let strings = if strsz > 0 {
        table(
            r,
            l,
            strtab,
            strsz,
            "the string table (DT_STRTAB, DT_STRSZ)",
        )?
    } else {
        &[][..]
    };
    let string_at = |off: u64, what: &str| -> Result<()> {
        if off >= strsz || !strings[off as usize..].contains(&0) {
            return Err(bad(format!(
                "{what}: string offset {off} is outside the {strsz}-byte string table or unterminated"
            )));
        }
        Ok(())
    };
    for (what, off) in &d.strings {
        string_at(*off, what)?;
    }
    // Entry sizes glibc asserts on.
    if d.syment.is_some_and(|v| v != 24) {
        return Err(bad(format!(
            "DT_SYMENT is {}, not 24",
            d.syment.unwrap_or(0)
        )));
    }
    if d.relaent.is_some_and(|v| v != 24) {
        return Err(bad(format!(
            "DT_RELAENT is {}, not 24",
            d.relaent.unwrap_or(0)
        )));
    }
    if d.relrent.is_some_and(|v| v != 8) {
        return Err(bad(format!(
            "DT_RELRENT is {}, not 8",
            d.relrent.unwrap_or(0)
        )));
    }
    if d.pltrel.is_some_and(|v| v != 7) {
        return Err(bad(format!(
            "DT_PLTREL is {}, not DT_RELA (7)",
            d.pltrel.unwrap_or(0)
        )));
    }
    // Symbols: how many there are comes from the hash tables.
    let nsyms = symbol_count(r, l, d)?;
    let Some(symtab) = d.symtab else {
        if d.rela.is_some() || d.jmprel.is_some() {
            return Err(bad("relocations without a symbol table (DT_SYMTAB)"));
        }
        return check_arrays(r, l, d, &[]);
    };
    if symtab % 8 != 0 {
        return Err(bad(format!("DT_SYMTAB {symtab:#x} is not 8-byte aligned")));
    }
    let syms = table(
        r,
        l,
        symtab,
        nsyms * 24,
        "the symbol table (DT_SYMTAB, counted by the hash table)",
    )?;
    for i in 0..nsyms as usize {
        let e = &syms[i * 24..i * 24 + 24];
        let name = u32::from_le_bytes(e[0..4].try_into().expect("4"));
        if name != 0 || strsz > 0 {
            string_at(u64::from(name), &format!("symbol {i} (st_name)"))?;
        }
        let kind = e[4] & 0xf;
        let shndx = u16::from_le_bytes(e[6..8].try_into().expect("2"));
        let value = u64::from_le_bytes(e[8..16].try_into().expect("8"));
        let size = u64::from_le_bytes(e[16..24].try_into().expect("8"));
        let what = format!("symbol {i} (st_value {value:#x}, st_shndx {shndx:#x}, type {kind})");
        // Defined symbols are what the loader hands out: functions (and ifunc resolvers) must
        // be code of the image, data must lie in the image. TLS symbols are offsets in the
        // TLS block, absolute ones are values.
        match (shndx, kind) {
            (0, _) | (_, 6) => {}
            (0xfff1, 2 | 10) => {
                return Err(bad(format!("{what}: an absolute function address")));
            }
            (0xfff1, _) => {}
            (_, 2 | 10) if !l.is_executable(value) => {
                return Err(bad(format!("{what}: a function outside the image's code")));
            }
            (_, 1) if l.segment_of(value, size.max(1)).is_none() => {
                return Err(bad(format!(
                    "{what}: an object of {size} bytes outside the image's segments"
                )));
            }
            _ => {}
        }
    }
    check_versions(r, l, d, nsyms, &string_at)?;
    // Relocations.
    let mut relocated: Vec<(u64, u32, u64)> = Vec::new();
    for (what, addr, size) in [
        ("DT_RELA", d.rela, d.relasz),
        ("DT_JMPREL", d.jmprel, d.pltrelsz),
    ] {
        let Some(addr) = addr else { continue };
        let size = size.ok_or_else(|| bad(format!("{what} without its size")))?;
        if size % 24 != 0 || addr % 8 != 0 {
            return Err(bad(format!(
                "{what}: size {size} is not a whole number of 24-byte entries, or {addr:#x} is unaligned"
            )));
        }
        let rel = table(r, l, addr, size, what)?;
        // DT_RELACOUNT promises that many leading relative relocations (glibc asserts it).
        if what == "DT_RELA"
            && let Some(n) = d.relacount
        {
            let relative = match machine {
                62 => 8,
                183 => 1027,
                224 => 13,
                _ => u32::MAX,
            };
            if n > size / 24 {
                return Err(bad(format!(
                    "DT_RELACOUNT {n} is more than the {} DT_RELA entries",
                    size / 24
                )));
            }
            for (i, e) in rel.chunks_exact(24).take(n as usize).enumerate() {
                let kind = u64::from_le_bytes(e[8..16].try_into().expect("8")) as u32;
                if relative != u32::MAX && kind != relative {
                    return Err(bad(format!(
                        "DT_RELA entry {i} has type {kind}, but DT_RELACOUNT {n} says the first {n} are relative ({relative})"
                    )));
                }
            }
        }
        for (i, e) in rel.chunks_exact(24).enumerate() {
            let offset = u64::from_le_bytes(e[0..8].try_into().expect("8"));
            let info = u64::from_le_bytes(e[8..16].try_into().expect("8"));
            let addend = u64::from_le_bytes(e[16..24].try_into().expect("8"));
            let (sym, kind) = (info >> 32, info as u32);
            let entry =
                format!("{what} entry {i} (r_offset {offset:#x}, type {kind}, symbol {sym})");
            if kind == 0 {
                continue;
            }
            if let Some(known) = known_relocations(machine)
                && !known.contains(&kind)
            {
                return Err(bad(format!(
                    "{entry}: relocation type {kind} is not one a loader applies here"
                )));
            }
            if sym >= nsyms {
                return Err(bad(format!(
                    "{entry}: symbol index beyond the {nsyms} symbols"
                )));
            }
            let writable = l.is_writable(offset, 8);
            if !(writable || d.textrel && l.segment_of(offset, 8).is_some()) {
                return Err(bad(format!(
                    "{entry}: writes outside the image's writable segments"
                )));
            }
            relocated.push((offset, kind, addend));
        }
    }
    if let Some(addr) = d.relr {
        let size = d.relrsz.ok_or_else(|| bad("DT_RELR without DT_RELRSZ"))?;
        if size % 8 != 0 || addr % 8 != 0 {
            return Err(bad("DT_RELR: size or address not a multiple of 8"));
        }
        let relr = table(r, l, addr, size, "DT_RELR")?;
        let mut base = 0u64;
        for (i, e) in relr.chunks_exact(8).enumerate() {
            let v = u64::from_le_bytes(e.try_into().expect("8"));
            if v & 1 == 0 {
                if !l.is_writable(v, 8) {
                    return Err(bad(format!(
                        "DT_RELR entry {i}: address {v:#x} is not writable"
                    )));
                }
                base = v + 8;
            } else {
                for bit in 1..64 {
                    if v >> bit & 1 == 1 {
                        let a = base + (bit - 1) * 8;
                        if !l.is_writable(a, 8) {
                            return Err(bad(format!(
                                "DT_RELR entry {i}: address {a:#x} is not writable"
                            )));
                        }
                    }
                }
                base += 63 * 8;
            }
        }
    }
    check_arrays(r, l, d, &relocated)
}

/// The number of dynamic symbols, from `DT_HASH` or `DT_GNU_HASH` (both checked).
fn symbol_count(r: &Reader<'_>, l: &Layout, d: &Dynamic) -> Result<u64> {
    let mut count = None;
    if let Some(h) = d.hash {
        let head = table(r, l, h, 8, "DT_HASH header")?;
        let nbucket = u64::from(u32::from_le_bytes(head[0..4].try_into().expect("4")));
        let nchain = u64::from(u32::from_le_bytes(head[4..8].try_into().expect("4")));
        let words = table(
            r,
            l,
            h,
            8 + 4 * (nbucket + nchain),
            "DT_HASH table (nbucket, nchain)",
        )?;
        for (i, w) in words[8..].chunks_exact(4).enumerate() {
            let v = u64::from(u32::from_le_bytes(w.try_into().expect("4")));
            if v >= nchain.max(1) && v != 0 {
                return Err(bad(format!(
                    "DT_HASH word {i} = {v} is not a symbol index below nchain {nchain}"
                )));
            }
        }
        count = Some(nchain);
    }
    if let Some(h) = d.gnu_hash {
        if h % 8 != 0 {
            return Err(bad(format!("DT_GNU_HASH {h:#x} is not 8-byte aligned")));
        }
        let head = table(r, l, h, 16, "DT_GNU_HASH header")?;
        let word = |i: usize| {
            u64::from(u32::from_le_bytes(
                head[i * 4..i * 4 + 4].try_into().expect("4"),
            ))
        };
        let (nbuckets, symoffset, bloom, shift) = (word(0), word(1), word(2), word(3));
        if bloom == 0 || !bloom.is_power_of_two() || shift >= 64 || nbuckets == 0 {
            return Err(bad(format!(
                "DT_GNU_HASH: {nbuckets} buckets, bloom filter of {bloom} words (must be a power of two), shift {shift}"
            )));
        }
        let buckets_at = h + 16 + bloom * 8;
        let buckets = table(r, l, buckets_at, nbuckets * 4, "DT_GNU_HASH buckets")?;
        let chain_at = buckets_at + nbuckets * 4;
        let mut max = 0u64;
        for b in buckets.chunks_exact(4) {
            let v = u64::from(u32::from_le_bytes(b.try_into().expect("4")));
            if v != 0 && v < symoffset {
                return Err(bad(format!(
                    "DT_GNU_HASH bucket {v} is below symoffset {symoffset}"
                )));
            }
            max = max.max(v);
        }
        let mut n = symoffset;
        if max >= symoffset && max != 0 {
            // Walk the last chain to its end (bit 0 set), bounded by the image.
            let mut i = max;
            loop {
                let c = table(r, l, chain_at + (i - symoffset) * 4, 4, "DT_GNU_HASH chain")?;
                let v = u32::from_le_bytes(c.try_into().expect("4"));
                i += 1;
                if v & 1 == 1 {
                    break;
                }
                if i - symoffset > (r.b.len() as u64) / 4 {
                    return Err(bad("DT_GNU_HASH chain does not end"));
                }
            }
            n = i;
        } else if let (Some(sym), Some(ent)) = (d.symtab, d.syment) {
            // No symbol is hashed (an image that defines nothing it exports, only imports:
            // the linker still writes a GNU hash, and its symoffset says nothing of the
            // imports). The table then runs up to the next table the dynamic section names
            // (ld.bfd and lld put the version, hash or string table right after it).
            let next = [
                d.strtab, d.hash, d.gnu_hash, d.versym, d.verneed, d.verdef, d.rela, d.jmprel,
                d.relr,
            ]
            .into_iter()
            .flatten()
            .filter(|&a| a > sym)
            .min();
            if let Some(next) = next
                && ent > 0
            {
                n = n.max((next - sym) / ent);
            }
        }
        if let Some(c) = count
            && c != n
        {
            return Err(bad(format!("DT_HASH counts {c} symbols, DT_GNU_HASH {n}")));
        }
        count = Some(n);
    }
    match (count, d.symtab) {
        (Some(n), _) => Ok(n),
        (None, None) => Ok(0),
        (None, Some(_)) => Err(bad("a symbol table without DT_HASH or DT_GNU_HASH")),
    }
}

fn check_versions(
    r: &Reader<'_>,
    l: &Layout,
    d: &Dynamic,
    nsyms: u64,
    string_at: &dyn Fn(u64, &str) -> Result<()>,
) -> Result<()> {
    let mut defined: Vec<u64> = vec![0, 1];
    if let Some(at) = d.verdef {
        let n = d
            .verdefnum
            .ok_or_else(|| bad("DT_VERDEF without DT_VERDEFNUM"))?;
        let mut p = at;
        for i in 0..n {
            let e = table(r, l, p, 20, &format!("DT_VERDEF entry {i}"))?;
            let version = u16::from_le_bytes(e[0..2].try_into().expect("2"));
            let ndx = u64::from(u16::from_le_bytes(e[4..6].try_into().expect("2")));
            let cnt = u16::from_le_bytes(e[6..8].try_into().expect("2"));
            let aux = u64::from(u32::from_le_bytes(e[12..16].try_into().expect("4")));
            let next = u64::from(u32::from_le_bytes(e[16..20].try_into().expect("4")));
            if version != 1 || cnt == 0 || aux < 20 && cnt > 0 {
                return Err(bad(format!(
                    "DT_VERDEF entry {i}: vd_version {version}, vd_cnt {cnt}, vd_aux {aux}"
                )));
            }
            let mut a = p + aux;
            for j in 0..cnt {
                let x = table(r, l, a, 8, &format!("DT_VERDEF entry {i} aux {j}"))?;
                string_at(
                    u64::from(u32::from_le_bytes(x[0..4].try_into().expect("4"))),
                    &format!("DT_VERDEF entry {i} aux {j} (vda_name)"),
                )?;
                let an = u64::from(u32::from_le_bytes(x[4..8].try_into().expect("4")));
                // The loader follows the links, not the counts: they must agree.
                if (an == 0) != (j + 1 == cnt) {
                    return Err(bad(format!(
                        "DT_VERDEF entry {i}: vd_cnt {cnt}, but aux {j} has vda_next {an}"
                    )));
                }
                a += an;
            }
            defined.push(ndx);
            if (next == 0) != (i + 1 == n) {
                return Err(bad(format!(
                    "DT_VERDEF entry {i} of DT_VERDEFNUM {n}: vd_next {next}"
                )));
            }
            p += next;
        }
    }
    if let Some(at) = d.verneed {
        let n = d
            .verneednum
            .ok_or_else(|| bad("DT_VERNEED without DT_VERNEEDNUM"))?;
        let mut p = at;
        for i in 0..n {
            let e = table(r, l, p, 16, &format!("DT_VERNEED entry {i}"))?;
            let version = u16::from_le_bytes(e[0..2].try_into().expect("2"));
            let cnt = u16::from_le_bytes(e[2..4].try_into().expect("2"));
            string_at(
                u64::from(u32::from_le_bytes(e[4..8].try_into().expect("4"))),
                &format!("DT_VERNEED entry {i} (vn_file)"),
            )?;
            let aux = u64::from(u32::from_le_bytes(e[8..12].try_into().expect("4")));
            let next = u64::from(u32::from_le_bytes(e[12..16].try_into().expect("4")));
            if version != 1 || (cnt > 0 && aux < 16) {
                return Err(bad(format!(
                    "DT_VERNEED entry {i}: vn_version {version}, vn_aux {aux}"
                )));
            }
            let mut a = p + aux;
            for j in 0..cnt {
                let x = table(r, l, a, 16, &format!("DT_VERNEED entry {i} aux {j}"))?;
                defined.push(u64::from(u16::from_le_bytes(
                    x[6..8].try_into().expect("2"),
                )));
                string_at(
                    u64::from(u32::from_le_bytes(x[8..12].try_into().expect("4"))),
                    &format!("DT_VERNEED entry {i} aux {j} (vna_name)"),
                )?;
                let an = u64::from(u32::from_le_bytes(x[12..16].try_into().expect("4")));
                // The loader follows the links, not the counts: they must agree.
                if (an == 0) != (j + 1 == cnt) {
                    return Err(bad(format!(
                        "DT_VERNEED entry {i}: vn_cnt {cnt}, but aux {j} has vna_next {an}"
                    )));
                }
                a += an;
            }
            if (next == 0) != (i + 1 == n) {
                return Err(bad(format!(
                    "DT_VERNEED entry {i} of DT_VERNEEDNUM {n}: vn_next {next}"
                )));
            }
            p += next;
        }
    }
    if let Some(at) = d.versym {
        if at % 2 != 0 {
            return Err(bad("DT_VERSYM is not 2-byte aligned"));
        }
        let v = table(r, l, at, nsyms * 2, "DT_VERSYM (one entry per symbol)")?;
        for (i, e) in v.chunks_exact(2).enumerate() {
            let ndx = u64::from(u16::from_le_bytes(e.try_into().expect("2")) & 0x7fff);
            if !defined.contains(&ndx) {
                return Err(bad(format!(
                    "DT_VERSYM entry {i}: version index {ndx} is not defined by DT_VERDEF or DT_VERNEED"
                )));
            }
        }
    }
    Ok(())
}

/// `DT_INIT`, `DT_FINI` and the initialiser arrays, which the loader calls: each must point
/// into an executable segment.
fn check_arrays(
    r: &Reader<'_>,
    l: &Layout,
    d: &Dynamic,
    relocated: &[(u64, u32, u64)],
) -> Result<()> {
    for (what, addr) in [("DT_INIT", d.init), ("DT_FINI", d.fini)] {
        if let Some(a) = addr
            && !l.is_executable(a)
        {
            return Err(bad(format!(
                "{what} {a:#x} is not in an executable segment"
            )));
        }
    }
    for (what, addr, size) in &d.arrays {
        let (addr, size) = match (addr, size) {
            (None, None) => continue,
            (Some(a), Some(s)) => (*a, *s),
            _ => {
                return Err(bad(format!(
                    "{what} without its size, or its size without it"
                )));
            }
        };
        if size % 8 != 0 || addr % 8 != 0 || !l.is_writable(addr, size) && size > 0 {
            return Err(bad(format!(
                "{what} at {addr:#x} ({size} bytes): not a whole number of aligned pointers in a writable segment"
            )));
        }
        for k in 0..size / 8 {
            let slot = addr + k * 8;
            // What the loader will call: a relocation's target, else the stored address.
            let target = match relocated.iter().find(|(o, _, _)| *o == slot) {
                Some((_, 8 | 13 | 38 | 1027, addend)) => *addend,
                Some(_) => continue, // bound to a symbol: resolved by the loader
                None => match l.file_offset(slot, 8) {
                    Some(off) => r.u64(off),
                    None => 0,
                },
            };
            if target != 0 && target != u64::MAX && !l.is_executable(target) {
                return Err(bad(format!(
                    "{what}[{k}] = {target:#x} is not in an executable segment"
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every shared object of the system's library directories (what glibc's loader is known to
    /// load) passes; a few dozen are enough to cover the structures real linkers write.
    #[test]
    fn the_systems_shared_objects_pass() {
        let mut checked = 0;
        for dir in [
            "/usr/lib/x86_64-linux-gnu",
            "/lib/x86_64-linux-gnu",
            "/usr/lib/llvm-19/lib",
        ] {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            let mut paths: Vec<_> = entries.filter_map(|e| e.ok()).map(|e| e.path()).collect();
            paths.sort();
            for p in paths {
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                if !name.contains(".so") || !p.is_file() {
                    continue;
                }
                if p.metadata().map_or(true, |m| m.len() > 16 << 20) {
                    continue;
                }
                let Ok(bytes) = std::fs::read(&p) else {
                    continue;
                };
                if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 || bytes[5] != 1 {
                    continue;
                }
                if let Err(e) = validate(&bytes) {
                    panic!("{}: {e}", p.display());
                }
                checked += 1;
            }
        }
        assert!(checked > 50, "only {checked} system libraries found");
    }

    /// A shared object that exports nothing and only imports (what clang's device link makes
    /// of an OpenMP program without target regions): its GNU hash hashes no symbol, so the
    /// table's size comes from its layout; both of Debian's linkers' outputs pass.
    #[test]
    fn an_object_that_only_imports_passes() {
        let dir = std::env::temp_dir().join(format!("offload-elf-dyn-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("empty.c");
        std::fs::write(&src, "static int unused;\n").unwrap();
        for linker in ["lld", "bfd"] {
            let out = dir.join(format!("empty-{linker}.so"));
            let status = std::process::Command::new("clang-19")
                .args(["-shared", "-fPIC", &format!("-fuse-ld={linker}")])
                .arg(&src)
                .arg("-o")
                .arg(&out)
                .status()
                .expect("clang-19 (scripts/setup.sh installs it)");
            assert!(status.success(), "clang-19 -fuse-ld={linker}");
            let bytes = std::fs::read(&out).unwrap();
            if let Err(e) = validate(&bytes) {
                panic!("{linker}: {e}");
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
