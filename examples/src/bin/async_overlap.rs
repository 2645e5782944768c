//! Work split into chunks over two queues: each chunk's upload, launch and download are
//! queued in a scope that borrows the host memory, so copies of one chunk overlap the kernel
//! of another; an event orders a final step on the other queue.

use offload::{LaunchDims, Runtime};
use std::time::Instant;

fn main() -> offload::Result<()> {
    let rt = Runtime::builder().build()?;
    let device = rt.default_device()?;
    // SAFETY: this crate's own kernels (kernels/, built by its build.rs), whose parameter
    // records are written beside their code.
    let program = unsafe { device.load_trusted(offload::include_kernels!("examples")) }?;
    let saxpy = program.kernel("saxpy")?;

    let (n, chunks) = (1 << 20, 8);
    let per = n / chunks;
    let x: Vec<f32> = (0..n).map(|i| (i % 100) as f32).collect();
    let mut out = vec![0.0f32; n];
    let dx = device.alloc::<f32>(n)?;
    let dy = device.alloc::<f32>(n)?;
    dy.fill(1.0)?;
    let queues = [device.queue()?, device.queue()?];
    let started = Instant::now();
    // Chunk c goes to queue c % 2; each queue's scope synchronises it at its end.
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
    // An event: the second queue waits for everything the first queue has done.
    let done = queues[0].record()?;
    queues[1].wait(&done)?;
    queues[1].synchronize()?;
    let ok = out.iter().zip(&x).all(|(o, x)| *o == 2.0 * x + 1.0);
    println!(
        "{chunks} chunks over 2 queues on {device} in {:.2} ms: {}",
        started.elapsed().as_secs_f64() * 1e3,
        if ok { "right" } else { "WRONG" }
    );
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}
