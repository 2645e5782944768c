//! `mpi-copies`: rank 0 of a job whose other ranks are `offload-mpi-proxy`
//! (tests/tests/mpi.rs). On every remote device, through the runtime and the mpi plugin:
//! synchronous copies of 0 bytes to 64 MiB + 5 there and back at an offset (single messages
//! and chunked streams, on both sides of the stream threshold) and device-to-device, checked
//! byte for byte; a queued read completed by an event, then by its queue; and four threads,
//! each with its own queue, writing, copying and reading their own buffers at once. Prints a
//! line per check; exits 1 on the first wrong byte or error.

use offload::Runtime;
use std::time::Instant;

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (i.wrapping_mul(0x9e37_79b9) ^ seed ^ (i >> 13)) as u8)
        .collect()
}

fn fail(what: String) -> offload::Error {
    offload::Error::InvalidArgument(what)
}

fn main() {
    if let Err(e) = run() {
        println!("mpi-copies: FAILED: {e}");
        std::process::exit(1);
    }
}

fn run() -> offload::Result<()> {
    let rt = Runtime::builder().build()?;
    let count = rt.plugin("mpi")?.device_count()?;
    let args: Vec<String> = std::env::args().collect();
    if let [_, flag, image, ms] = &args[..]
        && flag == "--nap"
    {
        return long_kernel(
            &rt.device("mpi", 0)?,
            image,
            ms.parse().expect("milliseconds"),
        );
    }
    let stream = 256 << 10;
    for i in 0..count {
        let device = rt.device("mpi", i)?;
        let name = device.info()?.name;
        let at = name.split(' ').next().unwrap_or("?").to_string();
        for len in [
            1usize,
            7,
            4096,
            stream - 1,
            stream,
            (1 << 20) + 3,
            (64 << 20) + 5,
        ] {
            let data = pattern(len, len as u64);
            let buf = device.alloc::<u8>(len + 32)?;
            buf.fill(0xa5)?;
            let t = Instant::now();
            buf.slice(16..16 + len)?.write(&data)?;
            let back = buf.to_vec()?;
            let took = t.elapsed();
            if back[16..16 + len] != data[..]
                || back[..16] != [0xa5; 16]
                || back[16 + len..] != [0xa5; 16]
            {
                return Err(fail(format!(
                    "{at}: {len} bytes did not come back as written"
                )));
            }
            let other = device.alloc::<u8>(len + 1)?;
            other.slice(..len)?.copy_from(buf.slice(16..16 + len)?)?;
            if other.slice(..len)?.to_vec()? != data {
                return Err(fail(format!(
                    "{at}: a device-to-device copy of {len} bytes differs"
                )));
            }
            println!("mpi-copies: {at}: {len} bytes there, back and across: ok ({took:?})");
        }
        queued_read_completed_by_an_event(&device, &at)?;
        threads(&device, &at)?;
    }
    println!("mpi-copies: ok, {count} devices");
    Ok(())
}

/// `nap(ms)` from the host image `image`, launched synchronously and on a queue: a kernel that
/// runs longer than OFFLOAD_MPI_TIMEOUT is not a dead proxy (it says it is busy).
fn long_kernel(device: &offload::Device, image: &str, ms: i32) -> offload::Result<()> {
    let at = device
        .info()?
        .name
        .split(' ')
        .next()
        .unwrap_or("?")
        .to_string();
    let image = std::fs::read(image).map_err(|e| fail(format!("{image}: {e}")))?;
    // SAFETY: the test's own kernel (tests/tests/mpi.rs), `void nap(int)`.
    let program = unsafe { device.load_trusted(&image) }?;
    let nap = program.kernel("nap")?;
    let dims = offload::LaunchDims::linear(1, 1);
    let args = [offload::KernelArg::I32(ms)];
    let t = Instant::now();
    // SAFETY: `nap` takes one int and touches no memory.
    unsafe { nap.launch(dims).args_raw(&args).unchecked().run() }?;
    let sync = t.elapsed();
    let queue = device.queue()?;
    let t = Instant::now();
    // SAFETY: as above.
    unsafe {
        nap.launch(dims)
            .args_raw(&args)
            .on(&queue)
            .unchecked()
            .run()
    }?;
    queue.synchronize()?;
    println!(
        "mpi-copies: {at}: a {ms} ms kernel, synchronous ({sync:?}) and queued ({:?}): ok",
        t.elapsed()
    );
    Ok(())
}

/// A read queued on a queue, completed by an event recorded after it: the bytes are in host
/// memory when the event's synchronisation returns (before the queue's).
fn queued_read_completed_by_an_event(device: &offload::Device, at: &str) -> offload::Result<()> {
    let len = 100_000;
    let data = pattern(len, 7);
    let buf = device.upload(&data)?;
    let mut out = vec![0u8; len];
    // SAFETY: `out` is this function's, untouched until the event's synchronisation; the
    // buffer outlives the queue's work.
    let raw = unsafe { offload::raw::device(device) };
    let q = raw.queue_create()?;
    // SAFETY: as above.
    unsafe { raw.copy_from_device(out.as_mut_ptr(), buf.ptr(), len, Some(q))? };
    let e = raw.event_create()?;
    raw.event_record(e, q)?;
    raw.event_synchronize(e)?;
    if out != data {
        return Err(fail(format!(
            "{at}: a queued read was not there at its event's synchronisation"
        )));
    }
    raw.event_destroy(e)?;
    raw.queue_destroy(q)?;
    println!("mpi-copies: {at}: a queued read completed by an event: ok");
    Ok(())
}

/// Four threads, each with its own queue and buffers, 10 rounds of queued write, copy and
/// read, checked after each round.
fn threads(device: &offload::Device, at: &str) -> offload::Result<()> {
    std::thread::scope(|s| {
        let running: Vec<_> = (0..4u64)
            .map(|t| {
                s.spawn(move || -> offload::Result<()> {
                    let queue = device.queue()?;
                    let len = 40_000 + 4_096 * t as usize;
                    let a = device.alloc::<u8>(len)?;
                    let b = device.alloc::<u8>(len)?;
                    for round in 0..10 {
                        let data = pattern(len, t * 100 + round);
                        let mut out = vec![0u8; len];
                        queue.scope(|q| {
                            q.write(&a, &data)?;
                            q.copy(&b, &a)?;
                            q.read(&mut out, &b)
                        })?;
                        if out != data {
                            return Err(fail(format!("{at}: thread {t} round {round} differs")));
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for r in running {
            r.join().expect("a thread panicked")?;
        }
        Ok::<(), offload::Error>(())
    })?;
    println!("mpi-copies: {at}: four threads, each with its own queue: ok");
    Ok(())
}
