//! The JIT's shared vocabulary: what a plugin asks for, what it gets back, and the byte format
//! both cross in (the plugin ABI's JIT service, and the pipe to the JIT worker process).
//!
//! Nothing here compiles anything and nothing here links LLVM: plugins and the runtime speak
//! these types, the JIT client (`offload-jit-client`) caches and routes them, and the worker
//! (`offload-jit`'s `offload-jit-worker`) is the only process that turns them into code.
//!
//! The parts: this file is the vocabulary (the types); `codec.rs` their byte encodings (the
//! plugin ABI's JIT service and the worker's payloads); [`wire`] the bounded reader and writer
//! those are made of; [`protocol`] the framed pipe to the worker; `tools.rs` where the tools of
//! post-processing are found. Decoding is bounded and checked: a truncated or corrupt message
//! is an error naming what was being read, never a panic or an unbounded allocation.

use crate::error::{Error, Result};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// A cache key: BLAKE3 over length-prefixed fields (computed by the JIT client).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct CacheKey(pub [u8; 32]);

impl CacheKey {
    /// Lower-case hex.
    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The first 12 hex digits, for messages.
    pub fn short(&self) -> String {
        self.hex()[..12].to_string()
    }
}

/// The type of a kernel parameter as the module declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParamType {
    /// `i32` (C `int`, `unsigned`).
    I32,
    /// `i64` (C `long long`, `size_t` on 64-bit targets).
    I64,
    /// `float`.
    F32,
    /// `double`.
    F64,
    /// Any pointer.
    Ptr,
    /// Anything else, spelled as LLVM prints it (`i16`, `<4 x float>`, a struct, ...).
    Other(String),
}

impl std::fmt::Display for ParamType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParamType::I32 => f.write_str("i32"),
            ParamType::I64 => f.write_str("i64"),
            ParamType::F32 => f.write_str("float"),
            ParamType::F64 => f.write_str("double"),
            ParamType::Ptr => f.write_str("ptr"),
            ParamType::Other(t) => f.write_str(t),
        }
    }
}

/// An exported function of a compiled module and its parameter types, so that a launch with
/// the wrong arguments can be refused instead of calling the kernel with garbage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelSignature {
    /// Symbol name.
    pub name: String,
    /// Parameter types in order.
    pub params: Vec<ParamType>,
}

/// The device a compile is for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct JitTarget {
    /// LLVM target triple of the device (`nvptx64-nvidia-cuda`, `x86_64-unknown-linux-gnu`).
    pub triple: String,
    /// Exact CPU / compute-unit kind (`sm_90`, `gfx90a`, `znver3`).
    pub cpu: String,
    /// LLVM target features, comma-separated (`+ptx80`, `+avx2,-avx512f`); may be empty.
    pub features: String,
}

/// What turns the code generator's output into what a device loads. Runs in the worker; its
/// [`PostProcess::id`] is part of the cache key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PostProcess {
    /// Hand the generated code over as it is (PTX for a driver that assembles it itself).
    Unchanged,
    /// Link the object into a host shared object with `ld.lld -shared`.
    LinkHostSharedObject,
    /// Link the object into an AMDGPU code object: `ld.lld -shared --no-undefined
    /// -plugin-opt=mcpu=<gfx>`, as upstream links JIT output.
    LinkAmdgpuCodeObject {
        /// The gfx target (`gfx90a`).
        gfx: String,
    },
    /// Assemble PTX into a cubin with NVIDIA's `ptxas` (`-arch=<arch> -O<JIT opt level>`).
    Ptxas {
        /// The `ptxas` executable the plugin found.
        path: String,
        /// Its `--version` (part of the key: another ptxas makes another cubin).
        version: String,
        /// The SM (`sm_90a`).
        arch: String,
    },
}

impl PostProcess {
    /// The step for code of `triple` compiled for `arch` (the SM or gfx target the image is
    /// for): `ptxas -arch=<arch>` for NVIDIA code when a `ptxas` (path, `--version`) was found,
    /// else the PTX as it is (the driver assembles it); an AMDGPU code object linked for
    /// `arch`; a shared object for a host triple (Linux); else the object as it is. Every
    /// backend and `offload jit` take their step from here.
    pub fn for_target(triple: &str, arch: &str, ptxas: Option<(&str, &str)>) -> PostProcess {
        if Self::takes_ptxas(triple) {
            return match ptxas {
                Some((path, version)) => PostProcess::Ptxas {
                    path: path.into(),
                    version: version.into(),
                    arch: arch.into(),
                },
                None => PostProcess::Unchanged,
            };
        }
        match triple.split('-').next().unwrap_or("") {
            "amdgcn" => PostProcess::LinkAmdgpuCodeObject { gfx: arch.into() },
            _ if triple.contains("linux") => PostProcess::LinkHostSharedObject,
            _ => PostProcess::Unchanged,
        }
    }

    /// Whether code of `triple` is NVIDIA PTX, which [`PostProcess::for_target`] assembles with
    /// the `ptxas` it is given (so a caller looks for one only then).
    pub fn takes_ptxas(triple: &str) -> bool {
        matches!(triple.split('-').next(), Some("nvptx64" | "nvptx"))
    }

    /// Identifies the step and its settings (goes into the cache key).
    pub fn id(&self) -> String {
        match self {
            PostProcess::Unchanged => "unchanged".into(),
            PostProcess::LinkHostSharedObject => "lld-shared".into(),
            PostProcess::LinkAmdgpuCodeObject { gfx } => {
                format!("lld-shared --no-undefined -plugin-opt=mcpu={gfx}")
            }
            PostProcess::Ptxas { version, arch, .. } => format!("ptxas -arch={arch} ({version})"),
        }
    }

    /// What the result is, for messages (`PTX text`, `linked shared object`).
    pub fn describe(&self, triple: &str) -> &'static str {
        match self {
            PostProcess::Unchanged if triple.starts_with("nvptx") => "PTX text",
            PostProcess::Unchanged => "object file",
            PostProcess::LinkHostSharedObject => "linked shared object",
            PostProcess::LinkAmdgpuCodeObject { .. } => "linked AMDGPU code object",
            PostProcess::Ptxas { .. } => "cubin (assembled by ptxas)",
        }
    }
}

/// What a plugin asks of the JIT: compile `image` for `target`, then `post`.
#[derive(Debug, Clone)]
pub struct CompileRequest<'a> {
    /// LLVM bitcode (raw or wrapped) or textual IR.
    pub image: &'a [u8],
    /// The device.
    pub target: JitTarget,
    /// The device's post-processing step.
    pub post: PostProcess,
}

/// A file a variable names as input, read when the configuration is made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedFile {
    /// The variable that named it (for messages).
    pub variable: String,
    /// The path.
    pub path: PathBuf,
    /// Its contents.
    pub bytes: Vec<u8>,
}

/// A path a variable names for output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputPath {
    /// The variable that named it (for messages).
    pub variable: String,
    /// The path.
    pub path: PathBuf,
}

impl OutputPath {
    /// Writes `bytes`, with an error that names the variable.
    pub fn write(&self, bytes: &[u8]) -> Result<()> {
        std::fs::write(&self.path, bytes).map_err(|e| {
            Error::System(format!(
                "{}='{}': cannot write: {e}",
                self.variable,
                self.path.display()
            ))
        })
    }
}

/// The settings that change what a compile produces (all of them are part of the key), plus
/// where to dump IR. Sent with every request, so the worker holds no configuration of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JitOptions {
    /// `default<On>` pipeline level and the code generator's level (0..=3).
    pub opt_level: u8,
    /// Skip the optimisation pipeline.
    pub skip_opt: bool,
    /// Replaces every input module.
    pub replacement_module: Option<NamedFile>,
    /// Replaces code generation output.
    pub replacement_object: Option<NamedFile>,
    /// IR dump before optimisation.
    pub pre_opt_ir: Option<OutputPath>,
    /// IR dump after optimisation.
    pub post_opt_ir: Option<OutputPath>,
    /// Where LLVM's OpenMP device runtimes are (`libomptarget-nvptx-sm_90.bc`,
    /// `libomptarget-amdgpu-gfx90a.bc`): an OpenMP device module that calls the runtime
    /// (`__kmpc_*`) is linked with the one for its target ([`openmp_device_runtime`]).
    pub device_runtime_dir: Option<PathBuf>,
}

impl Default for JitOptions {
    fn default() -> Self {
        JitOptions {
            opt_level: 3,
            skip_opt: false,
            replacement_module: None,
            replacement_object: None,
            pre_opt_ir: None,
            post_opt_ir: None,
            device_runtime_dir: None,
        }
    }
}

/// What one compile produces.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompileOutput {
    /// The image bytes.
    pub bytes: Vec<u8>,
    /// Signatures of the module's exported functions.
    pub signatures: Vec<KernelSignature>,
}

/// A compiled image as the JIT hands it out.
#[derive(Debug)]
pub struct CompiledImage {
    /// The key it is stored under.
    pub key: CacheKey,
    /// What the device loads (PTX text, an object, or a linked image).
    pub bytes: Vec<u8>,
    /// Signatures of the module's exported functions.
    pub signatures: Vec<KernelSignature>,
    /// How long the compile (and post-processing) took.
    pub compile_time: Duration,
}

/// How a request was served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// Found in memory.
    MemoryHit,
    /// Another thread was compiling the same key; this one waited for it.
    SharedCompile,
    /// Compiled by this request.
    Compiled,
    /// Read from the disk cache (written by this or another process, or by another node).
    DiskHit,
    /// Read from the remote cache (a cluster's shared Redis), and written to the disk cache.
    RemoteHit,
}

/// The result of a JIT request.
#[derive(Debug, Clone)]
pub struct JitOutput {
    /// The image to load.
    pub image: Arc<CompiledImage>,
    /// How the request was served.
    pub served: Served,
}

/// A JIT that plugins can ask for compiled images: the runtime's client (one per process,
/// handed to every plugin over the ABI), or a plugin's own when no runtime provides one.
pub trait JitService: Send + Sync {
    /// Compiles (or finds) the image for `request`.
    fn compile(&self, request: &CompileRequest<'_>) -> Result<JitOutput>;
}

mod codec;
pub mod protocol;
mod tools;
pub mod wire;

pub use codec::*;
pub use tools::{
    ENV_DEVICE_RUNTIME_DIR, ENV_LLD, LLD_CANDIDATES, locate_lld, openmp_device_runtime,
    openmp_device_runtime_name,
};
