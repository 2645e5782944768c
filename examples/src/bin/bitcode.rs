//! A kernel shipped as LLVM bitcode only: the host backend's JIT compiles it for this exact
//! CPU on first load (and caches it); the same checked launch as for a native image. Needs
//! the JIT worker, `offload-jit-worker` (next to the executable, on PATH, or
//! `OFFLOAD_JIT_WORKER`).

use offload::{LaunchDims, Runtime};

fn main() -> offload::Result<()> {
    let rt = Runtime::builder().build()?;
    let device = rt.device_by_spec("host")?;
    // SAFETY: this crate's own kernels (kernels/, built by its build.rs), whose parameter
    // records are written beside their code.
    let program = unsafe { device.load_trusted(offload::include_kernels!("examples_bitcode")) }?;
    let saxpy = program.kernel("saxpy")?;
    let n = 4096;
    let dx = device.upload(&vec![1.5f32; n])?;
    let mut dy = device.upload(&vec![2.0f32; n])?;
    // The extents are in the bitcode too: a launch past the buffers is refused.
    let refused = saxpy
        .launch(LaunchDims::for_elems(2 * n as u64, 256)?)
        .arg(2 * n as i32)
        .arg(2.0f32)
        .arg(&dx)
        .arg(&mut dy)
        .run();
    saxpy
        .launch(LaunchDims::for_elems(n as u64, 256)?)
        .arg(n as i32)
        .arg(2.0f32)
        .arg(&dx)
        .arg(&mut dy)
        .run()?;
    let ok = dy.to_vec()?.iter().all(|v| *v == 5.0) && refused.is_err();
    println!(
        "bitcode saxpy, JIT-compiled for {}: {}",
        device.info()?.compute_unit_kind,
        if ok { "right" } else { "WRONG" }
    );
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}
