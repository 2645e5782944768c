//! y = a*x + y on each remote device of an MPI job, checked: run it as rank 0 of a job whose
//! other ranks are proxies,
//!
//! ```text
//! mpirun -n 1 target/debug/mpi_saxpy : -n 2 target/debug/offload-mpi-proxy
//! ```
//!
//! On each remote device (`mpi:<rank>/<plugin>:<n>`): the native kernels and the bitcode ones
//! (compiled by the JIT on the proxy's node), a synchronous saxpy and one in chunks on two
//! queues, each queue driven by its own thread. A device that fails is reported and the
//! others still run.

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
            println!("mpi_saxpy: {name}: {what} saxpy, sync and on two queues: {outcome}");
            failed += usize::from(outcome != "right");
        }
    }
    if failed > 0 {
        std::process::exit(1);
    }
    Ok(())
}

/// Runs saxpy on `device` from `image` synchronously, then in chunks on two queues from two
/// threads; the number of wrong elements.
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
    saxpy
        .launch(LaunchDims::for_elems(n as u64, 256)?)
        .arg(n as i32)
        .arg(2.0f32)
        .arg(&dx)
        .arg(&mut dy)
        .run()?;
    let got = dy.to_vec()?;
    let mut wrong = (0..n).filter(|&i| got[i] != 2.0 * x[i] + y[i]).count();

    // Chunks on two queues: each chunk's upload, launch and download in flight together.
    let chunks = 8;
    let per = n / chunks;
    let mut out = vec![0.0f32; n];
    dy.write(&y)?;
    let queues = [device.queue()?, device.queue()?];
    let mut outs: Vec<&mut [f32]> = out.chunks_mut(per).collect();
    std::thread::scope(|threads| -> offload::Result<()> {
        let mut running = Vec::new();
        for (q, queue) in queues.iter().enumerate() {
            let mine: Vec<(usize, &mut [f32])> = outs
                .iter_mut()
                .enumerate()
                .filter(|(c, _)| c % 2 == q)
                .map(|(c, o)| (c, std::mem::take(o)))
                .collect();
            let (x, dx, dy, saxpy) = (&x, &dx, &dy, &saxpy);
            running.push(threads.spawn(move || {
                queue.scope(|s| {
                    for (c, host_out) in mine {
                        let range = c * per..(c + 1) * per;
                        s.write(dx.slice(range.clone())?, &x[range.clone()])?;
                        saxpy
                            .launch(LaunchDims::for_elems(per as u64, 256)?)
                            .arg(per as i32)
                            .arg(2.0f32)
                            .arg(dx.slice(range.clone())?)
                            .arg(dy.slice(range.clone())?)
                            .on(s)
                            .run()?;
                        s.read(host_out, dy.slice(range)?)?;
                    }
                    Ok(())
                })
            }));
        }
        for r in running {
            r.join().expect("a queue's thread panicked")?;
        }
        Ok(())
    })?;
    wrong += (0..n).filter(|&i| out[i] != 2.0 * x[i] + y[i]).count();
    Ok(wrong)
}
