//! Intel GPU native binaries ("zebin"): 64-bit little-endian ELF, `e_machine` 205
//! (`EM_INTELGT`), `e_type` `ET_REL` (what Intel's compiler writes) or one of the zebin types
//! (`0xff11`, `0xff12`), one `.text.<kernel>` section per kernel. Checked as ELF (every header
//! and section inside the file) before a driver sees it; the kernels are named by their
//! sections. The `.ze_info` section (YAML the compiler writes: each kernel's payload arguments)
//! says which parameters are `__local` pointers ([`Zebin::locals`]), which the driver takes as a
//! size with no value.

use object::{Object, ObjectSection};
use offload_core::image::{ElfRequirements, machine};
use offload_core::{ElfImage, Error, Result};
use std::collections::BTreeMap;

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

/// What the plugin reads of a zebin.
#[derive(Debug)]
pub struct Zebin {
    /// Its kernels' names, from the `.text.<kernel>` sections.
    pub kernels: Vec<String>,
    /// The `__local` pointer parameters of each kernel, by argument index, from its
    /// `.ze_info` section: the `payload_arguments` of `arg_type: arg_bypointer` with
    /// `addrspace: local` (or `addrmode: slm`). Empty when the zebin has no `.ze_info` (then no
    /// parameter is known to be one). Only the part of the YAML this needs is read: the
    /// top-level `kernels:` list, each item's `name:`, its `payload_arguments:` list and their
    /// `key: value` pairs.
    pub locals: BTreeMap<String, Vec<u32>>,
}

/// Checks `bytes` as a zebin and reads its kernels and their `__local` parameters.
pub fn read(bytes: &[u8]) -> Result<Zebin> {
    ElfImage::parse(bytes, &requirements())?;
    let aligned = offload_core::image::Aligned::new(bytes);
    let file = object::File::parse(aligned.bytes())
        .map_err(|e| Error::InvalidImage(format!("malformed zebin: {e}")))?;
    let mut kernels = Vec::new();
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
            kernels.push(k.to_string());
        }
    }
    if kernels.is_empty() {
        return Err(Error::InvalidImage(
            "zebin has no kernel: no `.text.<kernel>` section".into(),
        ));
    }
    let locals = match file.section_by_name(".ze_info") {
        None => BTreeMap::new(),
        Some(section) => {
            let data = section
                .data()
                .map_err(|e| Error::InvalidImage(format!("zebin section .ze_info: {e}")))?;
            let text = std::str::from_utf8(data).map_err(|e| {
                Error::InvalidImage(format!("zebin section .ze_info is not UTF-8 text: {e}"))
            })?;
            read_ze_info(text)
        }
    };
    Ok(Zebin { kernels, locals })
}

/// See [`Zebin::locals`].
fn read_ze_info(text: &str) -> BTreeMap<String, Vec<u32>> {
    let mut locals: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    let mut in_kernels = false;
    let mut kernel_indent: Option<usize> = None;
    let mut kernel: Option<String> = None;
    // The indentation of `payload_arguments:` while in that list, and the item being read.
    let mut payload: Option<usize> = None;
    let mut item: BTreeMap<String, String> = BTreeMap::new();
    let flush = |item: &mut BTreeMap<String, String>,
                 kernel: &Option<String>,
                 locals: &mut BTreeMap<String, Vec<u32>>| {
        let get = |k: &str| item.get(k).map(String::as_str);
        let local = get("addrspace") == Some("local") || get("addrmode") == Some("slm");
        if let (Some(k), true, Some("arg_bypointer"), Some(index)) = (
            kernel,
            local,
            get("arg_type"),
            get("arg_index").and_then(|i| i.parse::<u32>().ok()),
        ) {
            locals.entry(k.clone()).or_default().push(index);
        }
        item.clear();
    };
    for raw in text.lines() {
        let line = raw.split(" #").next().unwrap_or("").trim_end();
        let body = line.trim_start();
        if body.is_empty() || body.starts_with('#') {
            continue;
        }
        let indent = line.len() - body.len();
        // A top-level key (list items may also start at column 0: `kernels:\n- name: k`).
        if indent == 0 && !body.starts_with("- ") {
            flush(&mut item, &kernel, &mut locals);
            payload = None;
            in_kernels = body == "kernels:";
            kernel = None;
            continue;
        }
        if !in_kernels {
            continue;
        }
        if let Some(name) = body.strip_prefix("- name:")
            && kernel_indent.is_none_or(|k| k == indent)
        {
            flush(&mut item, &kernel, &mut locals);
            payload = None;
            kernel_indent = Some(indent);
            let name = name.trim().trim_matches(|c| c == '\'' || c == '"');
            kernel = Some(name.to_string());
            locals.entry(name.to_string()).or_default();
            continue;
        }
        if let Some(p) = payload {
            if let Some(first) = body.strip_prefix("- ")
                && indent >= p
            {
                flush(&mut item, &kernel, &mut locals);
                pair(first, &mut item);
                continue;
            }
            if indent > p {
                pair(body, &mut item);
                continue;
            }
            flush(&mut item, &kernel, &mut locals);
            payload = None;
        }
        if body == "payload_arguments:" {
            payload = Some(indent);
        }
    }
    flush(&mut item, &kernel, &mut locals);
    locals.retain(|_, v| !v.is_empty());
    locals
}

/// One `key: value` line into `item`.
fn pair(body: &str, item: &mut BTreeMap<String, String>) {
    if let Some((k, v)) = body.split_once(':') {
        item.insert(
            k.trim().to_string(),
            v.trim().trim_matches(|c| c == '\'' || c == '"').to_string(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_parameters_are_read_from_the_payload_arguments() {
        let text = r#"version: '1.11'
kernels:
  - name: reverse
    execution_env:
      simd_size: 16
    payload_arguments:
      - arg_type: global_id_offset
        offset: 0
        size: 12
      - arg_type: arg_bypointer
        offset: 32
        size: 8
        arg_index: 0
        addrmode: stateless
        addrspace: global
      - arg_type: arg_bypointer
        offset: 0
        size: 0
        arg_index: 2   # the tile
        addrmode: slm
        addrspace: local
    per_thread_memory_buffers:
      - type: scratch
        size: 64
  - name: 'plain'
    payload_arguments:
    - arg_type: arg_byvalue
      arg_index: 0
      addrspace: local
    - arg_type: arg_bypointer
      arg_index: 3
      addrmode: slm
functions:
  - name: helper
    payload_arguments:
      - arg_type: arg_bypointer
        arg_index: 1
        addrspace: local
"#;
        let locals = read_ze_info(text);
        assert_eq!(
            locals.into_iter().collect::<Vec<_>>(),
            vec![
                ("plain".to_string(), vec![3]),
                ("reverse".to_string(), vec![2])
            ]
        );
        // List items at column 0, as other YAML writers put them.
        let flush_left = "kernels:\n- name: k\n  payload_arguments:\n  - arg_type: arg_bypointer\n    \
                          arg_index: 1\n    addrspace: local\n- name: k2\n  payload_arguments:\n  \
                          - arg_type: arg_bypointer\n    arg_index: 0\n    addrmode: slm\n";
        assert_eq!(
            read_ze_info(flush_left).into_iter().collect::<Vec<_>>(),
            vec![("k".to_string(), vec![1]), ("k2".to_string(), vec![0])]
        );
        assert!(read_ze_info("").is_empty());
        assert!(read_ze_info("kernels:\n  - name:\n    payload_arguments:\n      -\n").is_empty());
    }
}
