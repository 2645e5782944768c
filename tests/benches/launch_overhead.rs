//! Host launch overhead: an empty kernel launched with grid 1, block 1 through the runtime
//! (ABI table, argument marshalling, libffi call) against a direct call of the same function
//! from the same shared object; and the checked launch builder
//! (`kernel.launch(dims).arg(..).run()`, which checks every argument and extent against the
//! kernel's `OFFLOAD_PARAMS` record) and its unchecked run against the device API below it,
//! for the empty kernel and for saxpy (four arguments, two extents).
//!
//!     cargo bench -p offload-tests --bench launch_overhead
//!
//! Needs the workspace built in release (`cargo build --release --workspace`). The variants
//! of one kernel are timed batch by batch in turn, so all see the same machine; each round
//! keeps each variant's best batch, and the differences are taken within a round. Prints the
//! median over the rounds and their range. Diagnostics are off (no `OFFLOAD_INFO`,
//! `OFFLOAD_DEBUG`, `OFFLOAD_PROFILE`): the unchecked builder with raw arguments (which checks
//! for a diagnostics subscriber) against the device API (which does not) shows what the
//! builder and diagnostics that are off cost.

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

/// Each of `fs` timed in turn, batch after batch (so all see the same machine): the best
/// batch of each, in ns per call.
fn interleaved_ns(iterations: u32, fs: &mut [&mut dyn FnMut()]) -> Vec<f64> {
    let batch = 2_000;
    for f in fs.iter_mut() {
        for _ in 0..batch {
            f();
        }
    }
    let mut best = vec![f64::MAX; fs.len()];
    for _ in 0..iterations / batch {
        for (f, b) in fs.iter_mut().zip(&mut best) {
            let t = Instant::now();
            for _ in 0..batch {
                f();
            }
            *b = b.min(t.elapsed().as_secs_f64() * 1e9 / f64::from(batch));
        }
    }
    best
}

fn main() {
    let so = host_kernel("empty");
    let image = std::fs::read(&so).unwrap();
    let rt = host_runtime();
    let device = rt.device("host", 0).expect("host plugin");
    let program = offload_tests::load(&device, &image).unwrap();
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
    // SAFETY: the device API is used on this test's own allocations only, with no HostBuffer or safe-layer queue on them.
    let raw = unsafe { offload::raw::device(&device) }.clone();
    // saxpy on one element: four arguments, two buffers whose extents the builder checks.
    let saxpy_image = std::fs::read(host_kernel("saxpy")).unwrap();
    let saxpy_program = offload_tests::load(&device, &saxpy_image).unwrap();
    let saxpy = saxpy_program.kernel("saxpy").unwrap();
    let x = device.upload(&[1.0f32]).unwrap();
    let mut y = device.upload(&[1.0f32]).unwrap();
    let mut y2 = device.upload(&[1.0f32]).unwrap();
    let saxpy_args = [KernelArg::I32(1), KernelArg::F32(0.0), x.arg(), y.arg()];
    let rounds = 9;
    let mut m: [Vec<f64>; 6] = Default::default();
    for _ in 0..rounds {
        let empty = interleaved_ns(
            n,
            &mut [
                &mut || {
                    // SAFETY: `empty` takes no argument and touches no memory.
                    unsafe { kernel.launch(dims).args_raw(&args).unchecked().run() }.unwrap()
                },
                // SAFETY: as above.
                &mut || unsafe { raw.launch(kernel.handle(), &dims, &args, None) }.unwrap(),
                &mut || kernel.launch(dims).run().unwrap(),
            ],
        );
        let saxpy = interleaved_ns(
            n,
            &mut [
                &mut || {
                    // SAFETY: the buffers hold one float each, the launch's one work item.
                    unsafe { raw.launch(saxpy.handle(), &dims, &saxpy_args, None) }.unwrap()
                },
                &mut || {
                    saxpy
                        .launch(dims)
                        .arg(1i32)
                        .arg(0.0f32)
                        .arg(&x)
                        .arg(&mut y)
                        .run()
                        .unwrap()
                },
                &mut || {
                    // SAFETY: saxpy touches x[0..1) and y[0..1); both hold one float.
                    unsafe {
                        saxpy
                            .launch(dims)
                            .arg(1i32)
                            .arg(0.0f32)
                            .arg(&x)
                            .arg(&mut y2)
                            .unchecked()
                            .run()
                    }
                    .unwrap()
                },
            ],
        );
        for (v, t) in m.iter_mut().zip(empty.into_iter().chain(saxpy)) {
            v.push(t);
        }
    }
    // (min, median, max) over the rounds.
    let spread = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        (v[0], v[v.len() / 2], v[v.len() - 1])
    };
    let diff = |a: &[f64], b: &[f64]| -> Vec<f64> { a.iter().zip(b).map(|(x, y)| x - y).collect() };
    println!(
        "host launch overhead (grid 1, block 1), best batch of 2000 per variant in {n} calls per round, the variants of a kernel interleaved batch by batch; median over {rounds} rounds (min .. max):"
    );
    println!("  {:<34} {direct_ns:8.1} ns", "direct call (empty)");
    let show = |name: &str, v: &[f64]| {
        let (lo, mid, hi) = spread(v);
        println!("  {name:<34} {mid:8.1} ns ({lo:.1} .. {hi:.1})");
    };
    show("unchecked builder (empty, raw)", &m[0]);
    show("device API launch (empty)", &m[1]);
    show("checked builder run (empty)", &m[2]);
    show("device API launch (saxpy, 4 args)", &m[3]);
    show("checked builder run (saxpy)", &m[4]);
    show("unchecked builder (saxpy)", &m[5]);
    let (lo, mid, hi) = spread(&m[0]);
    println!(
        "  {:<34} {:8.1}x ({:.1} .. {:.1})",
        "ratio unchecked builder/direct",
        mid / direct_ns,
        lo / direct_ns,
        hi / direct_ns
    );
    println!("differences in the same round (median over rounds, min .. max):");
    let d = |name: &str, v: Vec<f64>| {
        let (lo, mid, hi) = spread(&v);
        println!("  {name:<34} {mid:+8.1} ns ({lo:+.1} .. {hi:+.1})");
    };
    d("unchecked builder - API (empty)", diff(&m[0], &m[1]));
    d("builder - device API (empty)", diff(&m[2], &m[1]));
    d("builder - device API (saxpy)", diff(&m[4], &m[3]));
    d("unchecked - device API (saxpy)", diff(&m[5], &m[3]));
    d("the check itself (saxpy)", diff(&m[4], &m[5]));
}
