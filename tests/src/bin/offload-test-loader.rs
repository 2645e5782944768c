//! Loads bitcode images on the host device from several threads at once, for the disk cache's
//! multi-process test (`tests/tests/jit_disk_cache.rs`).
//!
//!     offload-test-loader THREADS IMAGE=VALUE...
//!
//! Every thread loads every image (each thread in its own order), runs its `which` kernel over
//! 64 work items and checks that work item i wrote VALUE + i (VALUE in hex). Prints one JSON
//! object: this process's compiles, disk hits and memory hits, whether it started a JIT
//! worker, and whether libLLVM is mapped into it. Exit 1 on any wrong result or error.

use offload::{KernelArg, LaunchDims};
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((threads, images)) = args.split_first() else {
        eprintln!("usage: offload-test-loader THREADS IMAGE=HEX...");
        return ExitCode::from(2);
    };
    let threads: usize = threads.parse().expect("THREADS: a number");
    let images: Vec<(Vec<u8>, u32)> = images
        .iter()
        .map(|a| {
            let (path, value) = a.split_once('=').expect("IMAGE=HEX");
            (
                std::fs::read(path).expect("readable image"),
                u32::from_str_radix(value, 16).expect("HEX"),
            )
        })
        .collect();
    let rt = offload::Runtime::from_env().expect("runtime");
    let device = rt.device("host", 0).expect("host device");
    let failures: usize = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (device, images) = (&device, &images);
                s.spawn(move || {
                    let mut bad = 0;
                    for i in 0..images.len() {
                        let (image, want) = &images[(i + t) % images.len()];
                        let out = device.alloc_buffer(256).expect("buffer");
                        let result = offload_tests::load(device, image).and_then(|p| {
                            let k = p.kernel("which")?;
                            // SAFETY: the buffers are as long as the kernel touches for these arguments.
                            unsafe {
                                k.launch(LaunchDims::linear(2, 32))
                                    .args_raw(&[KernelArg::Ptr(out.ptr())])
                                    .unchecked()
                                    .run()
                            }
                        });
                        let mut raw = vec![0u8; 256];
                        out.read(&mut raw).expect("read back");
                        let ok = result.is_ok()
                            && raw.chunks_exact(4).enumerate().all(|(i, c)| {
                                u32::from_le_bytes(c.try_into().unwrap()) == *want + i as u32
                            });
                        if !ok {
                            eprintln!("thread {t}, image {}: {result:?}", (i + t) % images.len());
                            bad += 1;
                        }
                    }
                    bad
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let jit = rt.jit();
    let stats = jit.stats();
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    println!(
        "{}",
        serde_json::json!({
            "compiles": stats.compiles,
            "memory_hits": stats.memory_hits,
            "shared_waits": stats.shared_waits,
            "disk_hits": jit.disk().stats().hits,
            "remote_hits": jit.remote().map_or(0, |r| r.stats().hits),
            "remote_refused": jit.remote().map_or(0, |r| r.stats().refused),
            "remote_errors": jit.remote().map_or(0, |r| r.stats().errors),
            "remote_lock_waits": jit.remote().map_or(0, |r| r.stats().lock_waits),
            "lock_waits": jit.disk().stats().lock_waits,
            "worker_started": jit.worker_stats().starts > 0,
            "llvm_mapped": maps.contains("libLLVM"),
            "failures": failures,
        })
    );
    if failures > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
