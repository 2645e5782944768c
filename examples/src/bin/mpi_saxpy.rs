//! y = a*x + y on each remote device of an MPI job, checked: run it as rank 0 of a job whose
//! other ranks are proxies,
//!
//! ```text
//! mpirun -n 1 target/debug/mpi_saxpy : -n 2 target/debug/offload-mpi-proxy
//! ```
//!
//! On each remote device (`mpi:<rank>/<plugin>:<n>`): the native kernels and the bitcode ones
//! (compiled by the JIT on the proxy's node), a synchronous saxpy and one more on a queue. A
//! device that fails is reported and the others still run.

use offload::{Device, LaunchDims, Runtime};

fn main() -> offload::Result<()> {
    let rt = Runtime::builder().build()?;
    let slot = rt.plugin("mpi")?;
    let count = slot.device_count().map_err(|e| e.context("plugin 'mpi'"))?;
    if count == 0 {
        eprintln!("mpi_saxpy: the job has no remote device");
        std::process::exit(1);
    }
    // Each device on its own: one that fails (its proxy died) is reported, and the others
    // still run.
    let mut failed = 0;
    for i in 0..count {
        let device = rt.device("mpi", i)?;
        let name = device.info()?.name;
        for (what, image) in [
            ("native", offload::include_kernels!("examples")),
            ("bitcode", offload::include_kernels!("examples_bitcode")),
        ] {
            let outcome = match saxpy(&device, image) {
                Ok(0) => "right".to_string(),
                Ok(bad) => format!("{bad} wrong"),
                Err(e) => format!("FAILED: {e}"),
            };
            println!("mpi_saxpy: {name}: {what} saxpy, sync and on a queue: {outcome}");
            failed += usize::from(outcome != "right");
        }
    }
    if failed > 0 {
        std::process::exit(1);
    }
    Ok(())
}

/// Runs saxpy on `device` from `image` synchronously, then again on a queue (the launch and
/// the copy back in flight together); the number of wrong elements.
fn saxpy(device: &Device, image: &[u8]) -> offload::Result<usize> {
    // SAFETY: this crate's own kernels (kernels/, built by its build.rs), whose parameter
    // records are written beside their code.
    let program = unsafe { device.load_trusted(image) }?;
    let saxpy = program.kernel("saxpy")?;
    let n = 1 << 16;
    let x: Vec<f32> = (0..n).map(|i| (i % 1000) as f32).collect();
    let y: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
    let dx = device.upload(&x)?;
    let mut dy = device.upload(&y)?;
    let dims = LaunchDims::for_elems(n as u64, 256)?;
    saxpy
        .launch(dims)
        .arg(n as i32)
        .arg(2.0f32)
        .arg(&dx)
        .arg(&mut dy)
        .run()?;
    let once = dy.to_vec()?;
    let queue = device.queue()?;
    let mut twice = vec![0.0f32; n];
    queue.scope(|s| {
        let (x, y) = (dx.slice(..)?, dy.slice(..)?);
        saxpy
            .launch(dims)
            .arg(n as i32)
            .arg(2.0f32)
            .arg(x)
            .arg(y)
            .on(s)
            .run()?;
        s.read(&mut twice, &dy)
    })?;
    Ok((0..n)
        .filter(|&i| once[i] != 2.0 * x[i] + y[i] || twice[i] != 4.0 * x[i] + y[i])
        .count())
}
