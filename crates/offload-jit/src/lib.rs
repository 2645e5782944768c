//! # offload-jit
//!
//! The JIT engine: LLVM bitcode (or textual IR) becomes a native image for a device's exact
//! compute-unit kind. This crate links LLVM (`inkwell`, LLVM 19, dynamically) and is used in
//! exactly two places:
//! - the **worker** executable `offload-jit-worker` ([`serve`]), where every compile of a
//!   process runs, so that an LLVM crash, abort, runaway or memory bomb kills the worker and
//!   not the caller;
//! - the **engine library** `liboffload_jit.so` ([`ffi`]), opened by the client only in
//!   `OFFLOAD_JIT_ISOLATION=inprocess` mode (not crash-safe).
//!
//! Everything else (keys, the cache, single flight, the worker's life) is in
//! `offload-jit-client`, which links no LLVM. A compile here is stateless: [`compile_request`]
//! takes the image, the target and the settings and returns the post-processed image with the
//! kernels' signatures. No LLVM context or module outlives its compile.

pub mod compile;
pub mod ffi;
pub mod phases;
pub mod postprocess;
pub mod serve;
pub mod split;
mod target_info;

use offload_core::Result;
use offload_core::jit::CompileOutput;
use offload_core::jit::protocol::WorkerRequest;

/// Version of this engine (the worker reports it; the client puts its own in every key and
/// refuses a worker whose version differs).
pub const ENGINE_VERSION: &str = env!("CARGO_PKG_VERSION");

/// LLVM's version, `major.minor.patch`.
pub fn llvm_version() -> String {
    let (mut major, mut minor, mut patch) = (0u32, 0u32, 0u32);
    // SAFETY: writes three integers.
    unsafe { inkwell::llvm_sys::core::LLVMGetVersion(&mut major, &mut minor, &mut patch) };
    format!("{major}.{minor}.{patch}")
}

/// The host CPU as LLVM names it, and its features.
pub fn host_cpu() -> (String, String) {
    compile::initialize_targets();
    let name = inkwell::targets::TargetMachine::get_host_cpu_name();
    let features = inkwell::targets::TargetMachine::get_host_cpu_features();
    (
        name.to_string_lossy().into_owned(),
        features.to_string_lossy().into_owned(),
    )
}

/// One compile: code generation for the request's target, then its post-processing step.
pub fn compile_request(request: &WorkerRequest<'_>) -> Result<CompileOutput> {
    let work_groups = request.post == offload_core::jit::PostProcess::LinkHostSharedObject;
    let generated = compile::compile(
        request.image,
        &request.target,
        &request.options,
        work_groups,
    )?;
    let bytes = postprocess::run(&request.post, generated.bytes, request.options.opt_level)?;
    match request.post {
        offload_core::jit::PostProcess::Unchanged => {}
        offload_core::jit::PostProcess::Ptxas { .. } => phases::mark("ptxas"),
        _ => phases::mark("link"),
    }
    Ok(CompileOutput {
        bytes,
        signatures: generated.signatures,
    })
}
