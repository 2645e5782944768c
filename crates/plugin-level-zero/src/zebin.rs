//! Intel GPU native binaries ("zebin"): 64-bit little-endian ELF, `e_machine` 205
//! (`EM_INTELGT`), `e_type` `ET_REL` (what Intel's compiler writes) or one of the zebin types
//! (`0xff11`, `0xff12`), one `.text.<kernel>` section per kernel. Checked as ELF (every header
//! and section inside the file) before a driver sees it; the kernels are named by their
//! sections.

use object::{Object, ObjectSection};
use offload_core::image::{ElfRequirements, machine};
use offload_core::{ElfImage, Error, Result};

/// `ET_REL`, and the zebin types `ET_ZEBIN_REL`, `ET_ZEBIN_EXE` (Intel's compute runtime
/// accepts `ET_REL` and `0xff12`; `0xff11` is the older relocatable form).
pub const FILE_TYPES: [u16; 3] = [1, 0xff11, 0xff12];

/// The section of functions that are no kernel.
const NOT_A_KERNEL: &str = "Intel_Symbol_Table_Void_Program";

/// What the plugin requires of a zebin's ELF header.
pub fn requirements() -> ElfRequirements<'static> {
    ElfRequirements {
        plugin: "level-zero",
        machine: machine::INTELGT,
        file_types: &FILE_TYPES,
    }
}

/// Checks `bytes` as a zebin; its kernels' names, from the `.text.<kernel>` sections.
pub fn kernels(bytes: &[u8]) -> Result<Vec<String>> {
    ElfImage::parse(bytes, &requirements())?;
    let aligned = offload_core::image::Aligned::new(bytes);
    let file = object::File::parse(aligned.bytes())
        .map_err(|e| Error::InvalidImage(format!("malformed zebin: {e}")))?;
    let mut names = Vec::new();
    for s in file.sections() {
        let name = s.name().map_err(|e| {
            Error::InvalidImage(format!(
                "zebin section {} has an unreadable name: {e}",
                s.index().0
            ))
        })?;
        if let Some(k) = name.strip_prefix(".text.")
            && !k.is_empty()
            && k != NOT_A_KERNEL
        {
            names.push(k.to_string());
        }
    }
    if names.is_empty() {
        return Err(Error::InvalidImage(
            "zebin has no kernel: no `.text.<kernel>` section".into(),
        ));
    }
    Ok(names)
}
