//! SPIR-V modules, checked structurally before a driver sees them: the header (magic, version,
//! id bound, schema), every instruction's word count inside the module, the memory model, and
//! the kernels (`OpEntryPoint Kernel`) with their parameter types, read from the entry
//! function's `OpTypeFunction`. The errors name the word at fault. This is not a validator: the
//! ids of the instructions it does not read (decorations, loads, most type operands) are not
//! checked, so a module that is well formed only on the surface reaches the driver's own reader
//! (`spirv-val` is the tool for the rest).

use offload_core::jit::ParamType;
use offload_core::{Error, Result};
use std::collections::HashMap;

/// `OpEntryPoint`'s execution model for OpenCL kernels.
pub const EXECUTION_MODEL_KERNEL: u32 = 6;
/// The largest SPIR-V version read (1.6).
pub const MAX_MINOR: u32 = 6;
/// The most ids a module may have (SPIR-V's universal limit, 4,194,303).
pub const MAX_BOUND: u32 = 0x3f_ffff;

mod op {
    pub const MEMORY_MODEL: u32 = 14;
    pub const ENTRY_POINT: u32 = 15;
    pub const CAPABILITY: u32 = 17;
    pub const TYPE_VOID: u32 = 19;
    pub const TYPE_BOOL: u32 = 20;
    pub const TYPE_INT: u32 = 21;
    pub const TYPE_FLOAT: u32 = 22;
    pub const TYPE_VECTOR: u32 = 23;
    pub const TYPE_STRUCT: u32 = 30;
    pub const TYPE_POINTER: u32 = 32;
    pub const TYPE_FUNCTION: u32 = 33;
    pub const FUNCTION: u32 = 54;
}

/// `StorageClass Workgroup`: OpenCL's `__local`.
const STORAGE_WORKGROUP: u32 = 4;
/// `StorageClass Function`: a kernel parameter pointing there is a struct passed by value
/// (`FuncParamAttr ByVal`, as llvm-spirv writes one).
const STORAGE_FUNCTION: u32 = 7;
/// `Capability Kernel`.
const CAPABILITY_KERNEL: u32 = 6;

/// One parameter of a kernel, as a launch passes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Param {
    /// A value or a pointer to global memory: passed as the type says.
    Value(ParamType),
    /// A pointer to work-group local memory (`__local T *`): the launch passes its size in
    /// bytes (a 32-bit integer), and the driver gives each work-group that much.
    Local,
}

impl Param {
    /// The type the layer checks the launch's argument against.
    pub fn param_type(&self) -> ParamType {
        match self {
            Param::Value(t) => t.clone(),
            Param::Local => ParamType::I32,
        }
    }
}

/// One `OpEntryPoint`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryPoint {
    /// Its execution model (6: `Kernel`).
    pub model: u32,
    /// Its name.
    pub name: String,
    /// The entry function's parameters, when its type could be followed.
    pub params: Option<Vec<Param>>,
}

/// What the checks read of a module.
#[derive(Debug, Clone)]
pub struct Module {
    /// Its SPIR-V version (major, minor).
    pub version: (u32, u32),
    /// Its entry points, in order.
    pub entry_points: Vec<EntryPoint>,
}

impl Module {
    /// The kernel `name`: an error naming the kernels there are when there is none by that
    /// name, or when that entry point is not a kernel.
    pub fn kernel(&self, name: &str) -> Result<&EntryPoint> {
        match self.entry_points.iter().find(|e| e.name == name) {
            Some(e) if e.model == EXECUTION_MODEL_KERNEL => Ok(e),
            Some(e) => Err(Error::InvalidImage(format!(
                "SPIR-V entry point '{name}' has execution model {} ({}), not Kernel (6): Level \
                 Zero launches OpenCL kernels",
                e.model,
                model_name(e.model)
            ))),
            None => Err(Error::NotFound(format!(
                "kernel '{name}' is not an entry point of the SPIR-V module (its kernels: {})",
                self.kernel_names().join(", ")
            ))),
        }
    }

    /// The names of its `Kernel` entry points.
    pub fn kernel_names(&self) -> Vec<String> {
        self.entry_points
            .iter()
            .filter(|e| e.model == EXECUTION_MODEL_KERNEL)
            .map(|e| e.name.clone())
            .collect()
    }
}

fn model_name(model: u32) -> &'static str {
    match model {
        0 => "Vertex",
        4 => "Fragment",
        5 => "GLCompute",
        6 => "Kernel",
        _ => "another model",
    }
}

#[derive(Debug, Clone)]
enum Type {
    Void,
    Bool,
    Int(u32),
    Float(u32),
    /// Element count.
    Vector(u32),
    Struct,
    Pointer(u32),
    Function(Vec<u32>),
}

/// Checks `bytes` as a SPIR-V module and reads its entry points.
pub fn parse(bytes: &[u8]) -> Result<Module> {
    let bad = |what: String| Error::InvalidImage(format!("SPIR-V module: {what}"));
    if bytes.len() < 20 {
        return Err(bad(format!(
            "{} bytes, shorter than the 20-byte header",
            bytes.len()
        )));
    }
    if bytes.len() % 4 != 0 {
        return Err(bad(format!(
            "{} bytes, not a whole number of 4-byte words",
            bytes.len()
        )));
    }
    let words: Vec<u32> = bytes
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect();
    if words[0] != 0x0723_0203 {
        return Err(bad(format!(
            "magic is {:#010x} (word 0), not 0x07230203",
            words[0]
        )));
    }
    let version = words[1];
    let (major, minor) = ((version >> 16) & 0xff, (version >> 8) & 0xff);
    if version & 0xff00_00ff != 0 || major != 1 || minor > MAX_MINOR {
        return Err(bad(format!(
            "version word is {version:#010x} (word 1): versions 1.0 to 1.{MAX_MINOR} are \
             0x00010000 to 0x0001{MAX_MINOR:02x}00"
        )));
    }
    let bound = words[3];
    if bound == 0 || bound > MAX_BOUND {
        return Err(bad(format!(
            "id bound is {bound} (word 3): it must be 1 to {MAX_BOUND}"
        )));
    }
    if words[4] != 0 {
        return Err(bad(format!(
            "schema word is {:#x} (word 4), must be 0",
            words[4]
        )));
    }
    let id = |v: u32, at: usize, what: &str| -> Result<u32> {
        if v == 0 || v >= bound {
            Err(bad(format!(
                "{what} id {v} at word {at} is outside 1..{bound} (the module's id bound)"
            )))
        } else {
            Ok(v)
        }
    };
    let mut types: HashMap<u32, Type> = HashMap::new();
    let mut functions: HashMap<u32, u32> = HashMap::new();
    let mut entries: Vec<(u32, u32, String, usize)> = Vec::new();
    let mut memory_models = 0;
    let mut kernel_capability = false;
    let mut at = 5;
    while at < words.len() {
        let count = (words[at] >> 16) as usize;
        let opcode = words[at] & 0xffff;
        if count == 0 {
            return Err(bad(format!(
                "the instruction at word {at} (opcode {opcode}) has a word count of 0"
            )));
        }
        if at + count > words.len() {
            return Err(bad(format!(
                "the instruction at word {at} (opcode {opcode}) is {count} words long, past the \
                 module's end at word {}",
                words.len()
            )));
        }
        let ops = &words[at + 1..at + count];
        let need = |n: usize| -> Result<()> {
            if ops.len() < n {
                Err(bad(format!(
                    "the instruction at word {at} (opcode {opcode}) has {} operand words, it needs {n}",
                    ops.len()
                )))
            } else {
                Ok(())
            }
        };
        match opcode {
            op::CAPABILITY => {
                need(1)?;
                kernel_capability |= ops[0] == CAPABILITY_KERNEL;
            }
            op::MEMORY_MODEL => {
                need(2)?;
                memory_models += 1;
                // The addressing model: pointer arguments are passed as 64-bit values, so
                // 32-bit pointers cannot be (a Logical module has no kernel to find).
                if ops[0] == ADDRESSING_PHYSICAL32 {
                    return Err(Error::Unsupported(
                        "the SPIR-V module's addressing model is Physical32 (32-bit pointers); \
                         the Level Zero plugin runs Physical64 modules (compile for spirv64)"
                            .into(),
                    ));
                }
            }
            op::ENTRY_POINT => {
                need(3)?;
                let function = id(ops[1], at + 2, "OpEntryPoint function")?;
                let name = literal_string(&ops[2..]).ok_or_else(|| {
                    bad(format!(
                        "the name of OpEntryPoint at word {at} is not a NUL-terminated UTF-8 \
                         string inside the instruction"
                    ))
                })?;
                entries.push((ops[0], function, name, at));
            }
            op::TYPE_VOID | op::TYPE_BOOL | op::TYPE_STRUCT => {
                need(1)?;
                let t = id(ops[0], at + 1, "type")?;
                types.insert(
                    t,
                    match opcode {
                        op::TYPE_VOID => Type::Void,
                        op::TYPE_BOOL => Type::Bool,
                        _ => Type::Struct,
                    },
                );
            }
            op::TYPE_INT | op::TYPE_FLOAT => {
                need(2)?;
                let t = id(ops[0], at + 1, "type")?;
                types.insert(
                    t,
                    if opcode == op::TYPE_INT {
                        Type::Int(ops[1])
                    } else {
                        Type::Float(ops[1])
                    },
                );
            }
            op::TYPE_VECTOR => {
                need(3)?;
                let t = id(ops[0], at + 1, "type")?;
                types.insert(t, Type::Vector(ops[2]));
            }
            op::TYPE_POINTER => {
                need(3)?;
                let t = id(ops[0], at + 1, "type")?;
                types.insert(t, Type::Pointer(ops[1]));
            }
            op::TYPE_FUNCTION => {
                need(2)?;
                let t = id(ops[0], at + 1, "type")?;
                for (i, p) in ops[2..].iter().enumerate() {
                    id(*p, at + 3 + i, "parameter type")?;
                }
                types.insert(t, Type::Function(ops[2..].to_vec()));
            }
            op::FUNCTION => {
                need(4)?;
                let f = id(ops[1], at + 2, "function")?;
                functions.insert(f, ops[3]);
            }
            _ => {}
        }
        at += count;
    }
    if memory_models != 1 {
        return Err(bad(format!(
            "{memory_models} OpMemoryModel instructions; a module has exactly one"
        )));
    }
    let mut entry_points = Vec::new();
    for (model, function, name, at) in entries {
        if model == EXECUTION_MODEL_KERNEL && !kernel_capability {
            return Err(bad(format!(
                "kernel '{name}' (OpEntryPoint at word {at}) in a module without the Kernel \
                 capability"
            )));
        }
        let params = functions
            .get(&function)
            .and_then(|ty| match types.get(ty) {
                Some(Type::Function(params)) => Some(params),
                _ => None,
            })
            .map(|params| params.iter().map(|p| param(&types, *p)).collect::<Vec<_>>());
        entry_points.push(EntryPoint {
            model,
            name,
            params,
        });
    }
    Ok(Module {
        version: (major, minor),
        entry_points,
    })
}

fn param(types: &HashMap<u32, Type>, t: u32) -> Param {
    Param::Value(match types.get(&t) {
        Some(Type::Int(32)) => ParamType::I32,
        Some(Type::Int(64)) => ParamType::I64,
        Some(Type::Float(32)) => ParamType::F32,
        Some(Type::Float(64)) => ParamType::F64,
        Some(Type::Pointer(STORAGE_WORKGROUP)) => return Param::Local,
        Some(Type::Pointer(STORAGE_FUNCTION)) => {
            ParamType::Other("a struct passed by value".into())
        }
        Some(Type::Pointer(_)) => ParamType::Ptr,
        Some(Type::Int(w)) => ParamType::Other(format!("i{w}")),
        Some(Type::Float(w)) => ParamType::Other(format!("f{w}")),
        Some(Type::Vector(n)) => ParamType::Other(format!("a {n}-element vector")),
        Some(Type::Bool) => ParamType::Other("bool".into()),
        Some(Type::Struct) => ParamType::Other("a struct".into()),
        Some(Type::Void | Type::Function(_)) | None => ParamType::Other(format!("type %{t}")),
    })
}

/// The `OpMemoryModel` addressing model `Physical32`.
const ADDRESSING_PHYSICAL32: u32 = 1;

/// A SPIR-V literal string: UTF-8 up to a NUL inside `words`.
fn literal_string(words: &[u32]) -> Option<String> {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let end = bytes.iter().position(|&b| b == 0)?;
    String::from_utf8(bytes[..end].to_vec()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-assembled module: `saxpy(float a, global float *x, global float *y)` and a
    /// GLCompute entry point.
    fn module() -> Vec<u32> {
        let name = |s: &str| -> Vec<u32> {
            let mut b = s.as_bytes().to_vec();
            b.push(0);
            while b.len() % 4 != 0 {
                b.push(0);
            }
            b.chunks(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        };
        let ins = |op: u32, ops: &[u32]| -> Vec<u32> {
            let mut v = vec![((ops.len() as u32 + 1) << 16) | op];
            v.extend_from_slice(ops);
            v
        };
        let mut w = vec![0x0723_0203, 0x0001_0000, 0, 20, 0];
        w.extend(ins(17, &[4]));
        w.extend(ins(17, &[6]));
        w.extend(ins(14, &[2, 2]));
        let mut ep = vec![6, 10];
        ep.extend(name("saxpy"));
        w.extend(ins(15, &ep));
        let mut ep2 = vec![5, 11];
        ep2.extend(name("compute"));
        w.extend(ins(15, &ep2));
        w.extend(ins(19, &[1]));
        w.extend(ins(22, &[2, 32]));
        w.extend(ins(32, &[3, 5, 2]));
        w.extend(ins(32, &[4, 4, 2]));
        w.extend(ins(32, &[6, 7, 2]));
        w.extend(ins(33, &[5, 1, 2, 3, 3, 4, 6]));
        w.extend(ins(54, &[1, 10, 0, 5]));
        w
    }

    fn bytes(words: &[u32]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    #[test]
    fn kernels_and_their_parameters_are_read() {
        let m = parse(&bytes(&module())).unwrap();
        assert_eq!(m.version, (1, 0));
        assert_eq!(m.kernel_names(), vec!["saxpy"]);
        let k = m.kernel("saxpy").unwrap();
        assert_eq!(
            k.params,
            Some(vec![
                Param::Value(ParamType::F32),
                Param::Value(ParamType::Ptr),
                Param::Value(ParamType::Ptr),
                Param::Local,
                Param::Value(ParamType::Other("a struct passed by value".into())),
            ])
        );
        let e = m.kernel("compute").unwrap_err().to_string();
        assert!(e.contains("GLCompute"), "{e}");
        let e = m.kernel("nope").unwrap_err().to_string();
        assert!(e.contains("its kernels: saxpy"), "{e}");
    }

    #[test]
    fn broken_headers_and_instructions_name_the_word() {
        let good = module();
        // (word, new value, what the error must say)
        let cases: [(usize, u32, &str); 9] = [
            (0, 0x0723_0204, "magic"),
            (1, 0x0002_0000, "version word"),
            (1, 0x0001_0700, "version word"),
            (3, 0, "id bound"),
            (4, 1, "schema"),
            (5, 17, "word count of 0"),
            (5, (900 << 16) | 17, "past the"),
            (3, 5, "outside 1..5"),
            (9, (1 << 16) | 14, "operand words"),
        ];
        for (word, value, says) in cases {
            let mut w = good.clone();
            w[word] = value;
            let e = parse(&bytes(&w)).unwrap_err().to_string();
            assert!(e.contains(says), "want '{says}': {e}");
        }
        assert!(parse(&bytes(&good)[..19]).is_err());
        assert!(parse(&bytes(&good)[..23]).is_err());
    }

    #[test]
    fn seeded_mutants_are_refused_or_read_never_a_panic() {
        let good = bytes(&module());
        let mut state = 0x5eed_u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let (mut ok, mut refused) = (0, 0);
        for _ in 0..20_000 {
            let mut b = good.clone();
            for _ in 0..1 + next() % 4 {
                let i = (next() as usize) % b.len();
                b[i] = next() as u8;
            }
            if next() % 8 == 0 {
                let len = (next() as usize) % b.len();
                b.truncate(len);
            }
            match parse(&b) {
                Ok(m) => {
                    ok += 1;
                    for e in &m.entry_points {
                        let _ = m.kernel(&e.name);
                    }
                }
                Err(e) => {
                    // Malformed, or well formed with 32-bit pointers (a mutated addressing model).
                    assert!(
                        matches!(&e, Error::InvalidImage(_))
                            || matches!(&e, Error::Unsupported(m) if m.contains("Physical32")),
                        "{e:?}"
                    );
                    refused += 1;
                }
            }
        }
        assert!(ok > 0 && refused > 0, "{ok} read, {refused} refused");
    }
}
