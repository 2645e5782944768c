//! Large host modules compiled on several threads (`cpp/split_codegen.cpp`).
//!
//! OpenMP programs built with `-fopenmp-target-jit` hand the JIT the whole program's device
//! code as one module, and code generation runs on one thread: a 1.38 MB, 6000-function module
//! took as long as `opt-19 | llc-19 | ld.lld-19`. Here such a module is simplified whole (the
//! first half of `default<On>`: inlining needs every function), split into parts as LLVM's
//! LTO `splitCodeGen` splits, and each part is optimised (the second half) and compiled in an
//! LLVM context of its own, all parts at once; `ld.lld -r` joins the objects into one, which
//! the post-processing step then links as it links any object.
//!
//! Only object-file targets of the host CPU are split (PTX is one text; AMD code objects keep
//! their one-module path), only from [`MIN_PER_PART`] instructions per part, and never when an
//! option asks for the whole optimised module (its IR dump, a replacement object, no
//! optimisation). `OFFLOAD_JIT_CODEGEN_THREADS` sets the most parts (default: the cores, at
//! most 8; 1 turns splitting off). The parts' objects differ in bytes from the one-module
//! object, not in behaviour; the cache keeps whichever was made first.

use crate::compile::{Diagnostics, install_diagnostic_handler, target_machine};
use inkwell::context::Context;
use inkwell::llvm_sys;
use inkwell::module::Module;
use inkwell::targets::{FileType, TargetMachine};
use offload_core::jit::JitOptions;
use offload_core::{Error, Result};
use std::ffi::c_void;

/// Variable that sets the most threads (parts) of one compile.
pub const ENV_CODEGEN_THREADS: &str = "OFFLOAD_JIT_CODEGEN_THREADS";
/// The fewest instructions (before optimisation) a part is made for: smaller modules compile
/// in tens of milliseconds, less than splitting and joining cost.
pub const MIN_PER_PART: usize = 20_000;

unsafe extern "C" {
    fn offload_jit_simplify(
        m: llvm_sys::prelude::LLVMModuleRef,
        tm: llvm_sys::target_machine::LLVMTargetMachineRef,
        opt: u32,
    );
    fn offload_jit_optimize_part(
        m: llvm_sys::prelude::LLVMModuleRef,
        tm: llvm_sys::target_machine::LLVMTargetMachineRef,
        opt: u32,
    );
    fn offload_jit_split(
        m: llvm_sys::prelude::LLVMModuleRef,
        parts: u32,
        sink: unsafe extern "C" fn(*mut c_void, *const u8, usize),
        ctx: *mut c_void,
    ) -> u32;
}

/// The instructions of `module`'s function bodies.
fn instructions(module: &Module<'_>) -> usize {
    module
        .get_functions()
        .flat_map(|f| f.get_basic_block_iter())
        .map(|b| b.get_instructions().count())
        .sum()
}

/// How many parts to compile `module` in (1: not split).
pub fn parts(module: &Module<'_>, options: &JitOptions, triple: &str) -> Result<usize> {
    let host_object = triple.starts_with("x86_64") || triple.starts_with("aarch64");
    if !host_object
        || options.skip_opt
        || options.opt_level == 0
        || options.post_opt_ir.is_some()
        || options.replacement_object.is_some()
    {
        return Ok(1);
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    let threads =
        offload_core::env::u32_in_range(&[ENV_CODEGEN_THREADS], 1, 64, cores.clamp(1, 8))?;
    if threads == 1 {
        return Ok(1);
    }
    Ok((instructions(module) / MIN_PER_PART).clamp(1, threads as usize))
}

/// Receives one part's bitcode from `offload_jit_split`.
unsafe extern "C" fn collect(ctx: *mut c_void, bytes: *const u8, len: usize) {
    // SAFETY: `ctx` is the `Vec` `compile` passed, alive for the call; `bytes` is valid for
    // `len` bytes during it.
    unsafe {
        let parts = &mut *(ctx as *mut Vec<Vec<u8>>);
        parts.push(std::slice::from_raw_parts(bytes, len).to_vec());
    }
}

/// Optimises one part (bitcode) in a context of its own and generates its object.
fn compile_part(
    bitcode: &[u8],
    triple: &str,
    cpu: &str,
    features: &str,
    opt: u8,
) -> Result<Vec<u8>> {
    let tm = target_machine(triple, cpu, features, opt)?;
    let mut diagnostics = Diagnostics::default();
    let context = Context::create();
    install_diagnostic_handler(&context, &mut diagnostics);
    let buffer = inkwell::memory_buffer::MemoryBuffer::create_from_memory_range(bitcode, "part");
    let module = Module::parse_bitcode_from_buffer(&buffer, &context).map_err(|e| {
        Error::CompileFailure(format!(
            "a split part did not read back: {}",
            e.to_string_lossy()
        ))
    })?;
    // SAFETY: a module of this thread's context and this thread's machine.
    unsafe { offload_jit_optimize_part(module.as_mut_ptr(), tm.as_mut_ptr(), u32::from(opt)) };
    let out = tm
        .write_to_memory_buffer(&module, FileType::Object)
        .map_err(|e| {
            Error::CompileFailure(format!("code generation failed: {}", e.to_string_lossy()))
        })?;
    if !diagnostics.0.is_empty() {
        return Err(Error::CompileFailure(diagnostics.0.join("; ")));
    }
    Ok(out.as_slice().to_vec())
}

/// Compiles `module` (verified, not yet optimised) in `parts` parts at once: one object.
pub fn compile(
    module: &Module<'_>,
    tm: &TargetMachine,
    cpu: &str,
    features: &str,
    opt: u8,
    parts: usize,
) -> Result<Vec<u8>> {
    let triple = tm.get_triple().as_str().to_string_lossy().into_owned();
    // SAFETY: the module and machine of this compile.
    unsafe { offload_jit_simplify(module.as_mut_ptr(), tm.as_mut_ptr(), u32::from(opt)) };
    crate::phases::mark("optimize (simplification, whole module)");
    let mut bitcode: Vec<Vec<u8>> = Vec::new();
    // SAFETY: `collect` gets `bitcode`, alive for the call; the module is not used after.
    unsafe {
        offload_jit_split(
            module.as_mut_ptr(),
            parts as u32,
            collect,
            &mut bitcode as *mut Vec<Vec<u8>> as *mut c_void,
        )
    };
    crate::phases::mark(&format!("split into {} parts", bitcode.len()));
    let objects: Vec<Result<Vec<u8>>> = std::thread::scope(|s| {
        let handles: Vec<_> = bitcode
            .iter()
            .map(|b| {
                std::thread::Builder::new()
                    .name("offload-jit-part".into())
                    .stack_size(crate::serve::COMPILE_STACK)
                    .spawn_scoped(s, || compile_part(b, &triple, cpu, features, opt))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h.join().unwrap_or_else(|_| {
                    Err(Error::CompileFailure("a part's compile panicked".into()))
                }),
                Err(e) => Err(Error::System(format!("cannot start a compile thread: {e}"))),
            })
            .collect()
    });
    let objects = objects.into_iter().collect::<Result<Vec<_>>>()?;
    crate::phases::mark(&format!(
        "optimize and generate code ({} parts at once)",
        objects.len()
    ));
    let joined = crate::postprocess::join_objects(&objects)?;
    crate::phases::mark("join the parts' objects");
    Ok(joined)
}
