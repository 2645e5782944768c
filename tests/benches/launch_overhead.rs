//! Host launch overhead: an empty kernel launched with grid 1, block 1 through the runtime
//! (ABI table, argument marshalling, libffi call) against a direct call of the same function
//! from the same shared object, measured in the same run.
//!
//!     cargo bench -p offload-tests --bench launch_overhead
//!
//! Needs the workspace built in release (`cargo build --release --workspace`); prints the
//! per-launch times and their ratio. Diagnostics are off (no `OFFLOAD_INFO`, `OFFLOAD_DEBUG`,
//! `OFFLOAD_PROFILE`): the launch through the runtime (with its diagnostics span, inert) is
//! also compared with the same launch through the device API below it (no span), rounds of the
//! two interleaved, so the cost of diagnostics that are off shows as their difference.

use offload::{KernelArg, LaunchDims};
use offload_tests::*;
use std::hint::black_box;
use std::time::Instant;

fn per_call_ns(iterations: u32, mut f: impl FnMut()) -> f64 {
    for _ in 0..iterations / 10 {
        f();
    }
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..iterations {
            f();
        }
        best = best.min(t.elapsed().as_secs_f64() * 1e9 / f64::from(iterations));
    }
    best
}

fn main() {
    let so = host_kernel("empty");
    let image = std::fs::read(&so).unwrap();
    let rt = host_runtime();
    let device = rt.device("host", 0).expect("host plugin");
    let program = device.load(&image).unwrap();
    let kernel = program.kernel("empty").unwrap();
    let dims = LaunchDims::linear(1, 1);
    let args: [KernelArg; 0] = [];

    // SAFETY: loading the kernel library we just compiled; `empty` is `void empty(void)`.
    let lib = unsafe { libloading::Library::new(&so) }.unwrap();
    // SAFETY: as above.
    let direct: libloading::Symbol<unsafe extern "C" fn()> = unsafe { lib.get(b"empty") }.unwrap();
    let direct = *direct;

    let n = 200_000;
    // SAFETY: `direct` is `void empty(void)`.
    let direct_ns = per_call_ns(n, || unsafe { black_box(direct)() });
    let raw = device.raw().clone();
    let (mut launch_ns, mut raw_ns) = (f64::MAX, f64::MAX);
    for _ in 0..3 {
        launch_ns = launch_ns.min(per_call_ns(n, || {
            // SAFETY: the buffers are as long as the kernel touches for these arguments.
            unsafe { program.launch(&kernel, &dims, &args) }.unwrap()
        }));
        raw_ns = raw_ns.min(per_call_ns(n, || {
            raw.launch(kernel.handle(), &dims, &args, None).unwrap()
        }));
    }
    println!("host launch overhead (empty kernel, grid 1, block 1), best of 5 x {n}, 3 rounds:");
    println!("  direct call          {direct_ns:10.1} ns");
    println!("  offload launch       {launch_ns:10.1} ns");
    println!("  device-API launch    {raw_ns:10.1} ns   (below the runtime: no diagnostics span)");
    println!("  ratio launch/direct  {:10.1}x", launch_ns / direct_ns);
    println!(
        "  diagnostics off      {:+10.1} ns   (offload launch - device-API launch)",
        launch_ns - raw_ns
    );
}
