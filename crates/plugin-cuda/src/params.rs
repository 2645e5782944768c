//! A kernel's parameter sizes from its image, for drivers that cannot say (`cuFuncGetParamInfo`
//! is CUDA 12.4 on): the `.entry` parameter list of PTX text, the `EIATTR_KPARAM_INFO` records
//! of a cubin's `.nv.info.<kernel>` section. The driver reads one value per parameter through
//! the launch's pointer array, of the size the kernel declares: without the sizes, a launch
//! with too few arguments would make it read past that array.

use object::read::elf::ElfFile64;
use object::{Endianness, Object, ObjectSection};

/// `EIATTR_KPARAM_INFO`, in `EIFMT_SVAL` records.
const KPARAM_INFO: u8 = 0x17;
/// `EIATTR_PARAM_CBANK`: where the parameters live in the constant bank (kernels with any).
const PARAM_CBANK: u8 = 0x0a;
/// `EIATTR_CBANK_PARAM_SIZE`: their bytes in all.
const CBANK_PARAM_SIZE: u8 = 0x19;
const EIFMT_NVAL: u8 = 0x01;
const EIFMT_HVAL: u8 = 0x03;
const EIFMT_SVAL: u8 = 0x04;

/// The sizes of `kernel`'s parameters in PTX text, in order; `None` if the text has no
/// `.entry kernel(...)` or a parameter this reader does not know.
pub fn from_ptx(ptx: &[u8], kernel: &str) -> Option<Vec<usize>> {
    let text = std::str::from_utf8(ptx).ok()?;
    let mut rest = text;
    while let Some(at) = rest.find(".entry") {
        let after = &rest[at + ".entry".len()..];
        rest = after;
        let Some(name_rest) = after.trim_start().strip_prefix(kernel) else {
            continue;
        };
        let Some(list) = name_rest.trim_start().strip_prefix('(') else {
            continue;
        };
        let list = &list[..list.find(')')?];
        if list.trim().is_empty() {
            return Some(Vec::new());
        }
        return list.split(',').map(ptx_param_size).collect();
    }
    None
}

/// `.param .u32 n`, `.param .u64 .ptr .global .align 4 x`, `.param .align 8 .b8 s[24]`.
fn ptx_param_size(decl: &str) -> Option<usize> {
    let mut tokens = decl.split_whitespace();
    if tokens.next()? != ".param" {
        return None;
    }
    let mut element = None;
    let mut name = None;
    while let Some(t) = tokens.next() {
        match t {
            ".align" => {
                tokens.next()?;
            }
            ".ptr" | ".global" | ".const" | ".local" | ".shared" => {}
            t if t.starts_with('.') => element = Some(type_size(&t[1..])?),
            t => name = Some(t),
        }
    }
    let (element, name) = (element?, name?);
    let count = match name.split_once('[') {
        Some((_, n)) => n.strip_suffix(']')?.trim().parse::<usize>().ok()?,
        None => 1,
    };
    element.checked_mul(count)
}

/// The size of a PTX fundamental type (`u32`, `b8`, `f16x2`, `bf16`).
fn type_size(t: &str) -> Option<usize> {
    let (base, lanes) = match t.split_once('x') {
        Some((b, n)) => (b, n.parse::<usize>().ok()?),
        None => (t, 1),
    };
    let bits: usize = base
        .trim_start_matches(|c: char| c.is_ascii_alphabetic())
        .parse()
        .ok()?;
    let kind = base.trim_end_matches(|c: char| c.is_ascii_digit());
    if !matches!(kind, "b" | "u" | "s" | "f" | "bf") || bits % 8 != 0 || bits == 0 {
        return None;
    }
    (bits / 8).checked_mul(lanes)
}

/// The sizes of `kernel`'s parameters in a cubin, by ordinal; `None` if the cubin has no
/// `.nv.info.<kernel>` section, records that do not number the parameters 0..n once each, or
/// a parameter bank without `EIATTR_KPARAM_INFO` records (another record format). A kernel
/// without parameters has neither records nor a parameter bank.
pub fn from_cubin(cubin: &[u8], kernel: &str) -> Option<Vec<usize>> {
    let aligned = offload_core::image::Aligned::new(cubin);
    let file = ElfFile64::<Endianness>::parse(aligned.bytes()).ok()?;
    let section = file.section_by_name(&format!(".nv.info.{kernel}"))?;
    let data = section.data().ok()?;
    let mut sizes: Vec<Option<usize>> = Vec::new();
    let mut bank = None;
    let mut at = 0;
    while at + 4 <= data.len() {
        let (format, attribute) = (data[at], data[at + 1]);
        let value = u16::from_le_bytes([data[at + 2], data[at + 3]]) as usize;
        at += 4;
        match format {
            EIFMT_HVAL if attribute == CBANK_PARAM_SIZE => bank = Some(value),
            EIFMT_NVAL | EIFMT_HVAL => {}
            EIFMT_SVAL => {
                if attribute == PARAM_CBANK {
                    bank = bank.or(Some(usize::MAX));
                }
                let record = data.get(at..at + value)?;
                at += value;
                if attribute == KPARAM_INFO {
                    // u32 index, u16 ordinal, u16 offset, u32 flags with the size in bits 18-31.
                    if record.len() != 12 {
                        return None;
                    }
                    let ordinal = u16::from_le_bytes([record[4], record[5]]) as usize;
                    let flags = u32::from_le_bytes(record[8..12].try_into().ok()?);
                    if ordinal >= sizes.len() {
                        sizes.resize(ordinal + 1, None);
                    }
                    if sizes[ordinal].replace((flags >> 18) as usize).is_some() {
                        return None;
                    }
                }
            }
            _ => return None,
        }
    }
    if sizes.is_empty() {
        // No records: no parameters if there is no parameter bank (or an empty one), else
        // records of a format this reader does not know.
        return matches!(bank, None | Some(0)).then(Vec::new);
    }
    sizes.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptx_parameter_lists_give_their_sizes() {
        let ptx = b".visible .entry other(.param .u8 c)\n{}\n\
            .visible .entry k(\n\t.param .u32 k_param_0,\n\t.param .f32 a,\n\t\
            .param .u64 .ptr .global .align 4 x,\n\t.param .align 8 .b8 s[24],\n\t\
            .param .f16x2 h, .param .bf16 b\n)\n{\n ret;\n}\n\
            .visible .entry none()\n{}\n";
        assert_eq!(from_ptx(ptx, "k"), Some(vec![4, 4, 8, 24, 4, 2]));
        assert_eq!(from_ptx(ptx, "other"), Some(vec![1]));
        assert_eq!(from_ptx(ptx, "none"), Some(vec![]));
        // Not a prefix of another kernel's name, not missing.
        assert_eq!(from_ptx(ptx, "ot"), None);
        assert_eq!(from_ptx(ptx, "absent"), None);
        // Something unknown: no answer rather than a wrong one.
        assert_eq!(from_ptx(b".entry k(.param .texref t)", "k"), None);
        assert_eq!(from_ptx(b".entry k(.param .u32 n", "k"), None);
        assert_eq!(from_ptx(b".entry k(.param .b8 s[x])", "k"), None);
    }
}
