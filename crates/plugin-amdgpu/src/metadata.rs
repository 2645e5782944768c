//! The kernels of a code object, from its `NT_AMDGPU_METADATA` note (MessagePack): each
//! kernel's descriptor symbol, kernarg segment size and alignment, LDS and scratch sizes, and
//! its arguments with their offsets, sizes and kinds, which say how launch arguments are laid
//! out, including the hidden arguments the runtime fills in (code object v5: block counts,
//! group sizes, ...).

use crate::msgpack::{self, Value};
use object::Endianness;
use object::read::elf::{ElfFile64, FileHeader, ProgramHeader};
use offload_core::{Error, Result};

/// `NT_AMDGPU_METADATA`
const NT_AMDGPU_METADATA: u32 = 32;

/// What an argument is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArgKind {
    /// An explicit argument passed by value (`by_value`).
    ByValue,
    /// An explicit pointer to global memory (`global_buffer`).
    Pointer,
    /// A pointer to LDS the launch sizes (`dynamic_shared_pointer`, OpenCL's `__local T *`):
    /// the launch passes the size in bytes, the runtime the LDS offset, aligned to `align`.
    DynamicShared {
        /// `.pointee_align` (16 when the metadata does not say).
        align: u32,
    },
    /// A hidden argument the runtime fills in (`hidden_block_count_x`, ...).
    Hidden(String),
    /// Another explicit kind (`image`, `sampler`, `pipe`, `queue`: not supported here).
    Other(String),
}

/// One argument of a kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arg {
    /// Byte offset in the kernarg segment.
    pub offset: u32,
    /// Size in bytes.
    pub size: u32,
    /// What it is.
    pub kind: ArgKind,
    /// `.value_kind` as written.
    pub value_kind: String,
}

/// One kernel of a code object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kernel {
    /// Source-level name (`saxpy`).
    pub name: String,
    /// Its kernel descriptor symbol (`saxpy.kd`).
    pub symbol: String,
    /// Bytes of kernel arguments, hidden ones included.
    pub kernarg_segment_size: u32,
    /// Their alignment.
    pub kernarg_segment_align: u32,
    /// Static LDS bytes.
    pub group_segment_fixed_size: u32,
    /// Scratch bytes per work item.
    pub private_segment_fixed_size: u32,
    /// Wavefront size it was compiled for.
    pub wavefront_size: u32,
    /// Largest work-group it supports.
    pub max_flat_workgroup_size: u32,
    /// `.uses_dynamic_stack`: recursion or calls through pointers, whose stack the fixed
    /// private size does not cover.
    pub uses_dynamic_stack: bool,
    /// Every argument, explicit and hidden, in order.
    pub args: Vec<Arg>,
}

impl Kernel {
    /// The explicit (non-hidden) arguments: what a launch passes.
    pub fn explicit_args(&self) -> impl Iterator<Item = &Arg> {
        self.args
            .iter()
            .filter(|a| !matches!(a.kind, ArgKind::Hidden(_)))
    }
}

/// The code object's metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metadata {
    /// `amdhsa.target` (`amdgcn-amd-amdhsa--gfx90a`), if present.
    pub target: Option<String>,
    /// `amdhsa.version`.
    pub version: Vec<u64>,
    /// The kernels.
    pub kernels: Vec<Kernel>,
}

impl Metadata {
    /// The kernel named `name` (or whose descriptor symbol is `name`).
    pub fn kernel(&self, name: &str) -> Option<&Kernel> {
        self.kernels
            .iter()
            .find(|k| k.name == name || k.symbol == name)
    }
}

fn bad(what: impl std::fmt::Display) -> Error {
    Error::InvalidImage(format!("AMDGPU metadata note: {what}"))
}

/// Reads the metadata note of a (structurally checked) code object.
pub fn read(image: &[u8]) -> Result<Metadata> {
    let aligned = offload_core::image::Aligned::new(image);
    let bytes = aligned.bytes();
    let file = ElfFile64::<Endianness>::parse(bytes)
        .map_err(|e| Error::InvalidImage(format!("malformed code object: {e}")))?;
    let endian = file.endian();
    let headers = file
        .elf_header()
        .program_headers(endian, bytes)
        .map_err(|e| Error::InvalidImage(format!("code object program headers: {e}")))?;
    for ph in headers {
        let Some(mut notes) = ph
            .notes(endian, bytes)
            .map_err(|e| Error::InvalidImage(format!("code object note segment: {e}")))?
        else {
            continue;
        };
        while let Some(note) = notes
            .next()
            .map_err(|e| Error::InvalidImage(format!("code object note: {e}")))?
        {
            if note.name() == b"AMDGPU" && note.n_type(endian) == NT_AMDGPU_METADATA {
                let value = msgpack::parse(note.desc()).map_err(bad)?;
                return from_value(&value);
            }
        }
    }
    Err(bad(
        "the code object has none (no PT_NOTE entry named AMDGPU of type NT_AMDGPU_METADATA)",
    ))
}

fn u32_field(v: &Value, key: &str, what: &str) -> Result<u32> {
    v.get(key)
        .and_then(Value::as_u64)
        .and_then(|x| u32::try_from(x).ok())
        .ok_or_else(|| {
            bad(format!(
                "{what}: '{key}' is missing or not a 32-bit unsigned integer"
            ))
        })
}

fn from_value(v: &Value) -> Result<Metadata> {
    let target = v
        .get("amdhsa.target")
        .and_then(Value::as_str)
        .map(str::to_string);
    let version = v
        .get("amdhsa.version")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    let list = v
        .get("amdhsa.kernels")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("'amdhsa.kernels' is missing or not an array"))?;
    let mut kernels = Vec::with_capacity(list.len());
    for (i, k) in list.iter().enumerate() {
        let name = k
            .get(".name")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("kernel {i}: '.name' is missing")))?
            .to_string();
        let what = format!("kernel '{name}'");
        let symbol = k
            .get(".symbol")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("{what}: '.symbol' is missing")))?
            .to_string();
        let kernarg_segment_size = u32_field(k, ".kernarg_segment_size", &what)?;
        let kernarg_segment_align = u32_field(k, ".kernarg_segment_align", &what)?;
        if !kernarg_segment_align.is_power_of_two() || kernarg_segment_align > 4096 {
            return Err(bad(format!(
                "{what}: kernarg alignment {kernarg_segment_align} is not a power of two up to 4096"
            )));
        }
        let mut args = Vec::new();
        if let Some(list) = k.get(".args") {
            let list = list
                .as_array()
                .ok_or_else(|| bad(format!("{what}: '.args' is not an array")))?;
            for (j, a) in list.iter().enumerate() {
                let arg_what = format!("{what} argument {j}");
                let offset = u32_field(a, ".offset", &arg_what)?;
                let size = u32_field(a, ".size", &arg_what)?;
                let value_kind = a
                    .get(".value_kind")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(format!("{arg_what}: '.value_kind' is missing")))?
                    .to_string();
                if u64::from(offset) + u64::from(size) > u64::from(kernarg_segment_size) {
                    return Err(bad(format!(
                        "{arg_what}: bytes {offset}..{} lie outside the {kernarg_segment_size}-byte kernarg segment",
                        u64::from(offset) + u64::from(size)
                    )));
                }
                let kind = match value_kind.as_str() {
                    "by_value" => ArgKind::ByValue,
                    "global_buffer" => ArgKind::Pointer,
                    "dynamic_shared_pointer" => {
                        let align = match a.get(".pointee_align") {
                            Some(_) => u32_field(a, ".pointee_align", &arg_what)?,
                            None => 16,
                        };
                        if !align.is_power_of_two() || align > 4096 {
                            return Err(bad(format!(
                                "{arg_what}: '.pointee_align' {align} is not a power of two up to 4096"
                            )));
                        }
                        ArgKind::DynamicShared { align }
                    }
                    k if k.starts_with("hidden_") => ArgKind::Hidden(k.to_string()),
                    k => ArgKind::Other(k.to_string()),
                };
                args.push(Arg {
                    offset,
                    size,
                    kind,
                    value_kind,
                });
            }
        }
        kernels.push(Kernel {
            name,
            symbol,
            kernarg_segment_size,
            kernarg_segment_align,
            group_segment_fixed_size: u32_field(k, ".group_segment_fixed_size", &what)?,
            private_segment_fixed_size: u32_field(k, ".private_segment_fixed_size", &what)?,
            wavefront_size: u32_field(k, ".wavefront_size", &what)?,
            max_flat_workgroup_size: u32_field(k, ".max_flat_workgroup_size", &what)?,
            uses_dynamic_stack: matches!(k.get(".uses_dynamic_stack"), Some(Value::Bool(true))),
            args,
        });
    }
    Ok(Metadata {
        target,
        version,
        kernels,
    })
}
