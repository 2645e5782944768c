//! Host launch overhead: an empty kernel launched with grid 1, block 1 through the runtime
//! (ABI table, argument marshalling, libffi call) against a direct call of the same function
//! from the same shared object, measured in the same run; and the checked launch builder
//! (`kernel.launch(dims).arg(..).run()`, which checks every argument and extent against the
//! kernel's `OFFLOAD_PARAMS` record) against the device API below it, for the empty kernel and
//! for saxpy (four arguments, two extents).
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

/// `f` and `g` timed in alternating batches (so both see the same machine), the best batch of
/// each, in ns per call.
fn paired_ns(iterations: u32, mut f: impl FnMut(), mut g: impl FnMut()) -> (f64, f64) {
    let batch = 2_000;
    for _ in 0..batch {
        f();
        g();
    }
    let (mut bf, mut bg) = (f64::MAX, f64::MAX);
    for _ in 0..iterations / batch {
        let t = Instant::now();
        for _ in 0..batch {
            f();
        }
        bf = bf.min(t.elapsed().as_secs_f64() * 1e9 / f64::from(batch));
        let t = Instant::now();
        for _ in 0..batch {
            g();
        }
        bg = bg.min(t.elapsed().as_secs_f64() * 1e9 / f64::from(batch));
    }
    (bf, bg)
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
    // SAFETY: the device API is used on this test's own allocations only, with no HostBuffer or safe-layer queue on them.
    let raw = unsafe { device.raw() }.clone();
    // saxpy on one element: four arguments, two buffers whose extents the builder checks.
    let saxpy_image = std::fs::read(host_kernel("saxpy")).unwrap();
    let saxpy_program = device.load(&saxpy_image).unwrap();
    let saxpy = saxpy_program.kernel("saxpy").unwrap();
    let x = device.upload(&[1.0f32]).unwrap();
    let mut y = device.upload(&[1.0f32]).unwrap();
    let saxpy_args = [KernelArg::I32(1), KernelArg::F32(0.0), x.arg(), y.arg()];
    let rounds = 5;
    let mut m: [Vec<f64>; 6] = Default::default();
    for _ in 0..rounds {
        let (launch, api) = paired_ns(
            n,
            // SAFETY: `empty` takes no argument and touches no memory.
            || unsafe { program.launch(&kernel, &dims, &args) }.unwrap(),
            || raw.launch(kernel.handle(), &dims, &args, None).unwrap(),
        );
        let (builder, _) = paired_ns(n, || kernel.launch(dims).run().unwrap(), || {});
        m[0].push(launch);
        m[1].push(api);
        m[2].push(builder);
        let (api, builder) = paired_ns(
            n,
            || {
                raw.launch(saxpy.handle(), &dims, &saxpy_args, None)
                    .unwrap()
            },
            || {
                saxpy
                    .launch(dims)
                    .arg(1i32)
                    .arg(0.0f32)
                    .arg(&x)
                    .arg(&mut y)
                    .run()
                    .unwrap()
            },
        );
        m[3].push(api);
        m[4].push(builder);
        let (unchecked, _) = paired_ns(
            n,
            || {
                // SAFETY: saxpy touches x[0..1) and y[0..1); both hold one float.
                unsafe {
                    saxpy
                        .launch(dims)
                        .arg(1i32)
                        .arg(0.0f32)
                        .arg(&x)
                        .arg(&mut y)
                        .run_unchecked()
                }
                .unwrap()
            },
            || {},
        );
        m[5].push(unchecked);
    }
    let range = |v: &[f64]| {
        let (lo, hi) = v
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(*x), b.max(*x)));
        (lo, hi)
    };
    let diff = |a: &[f64], b: &[f64]| -> Vec<f64> { a.iter().zip(b).map(|(x, y)| x - y).collect() };
    println!(
        "host launch overhead (grid 1, block 1), best of 5 x {n} per round, {rounds} rounds interleaved (min..max over rounds):"
    );
    println!("  direct call (empty)              {direct_ns:10.1} ns");
    let show = |name: &str, v: &[f64]| {
        let (lo, hi) = range(v);
        println!("  {name:<32} {lo:10.1} .. {hi:.1} ns");
    };
    show("Program::launch (empty)", &m[0]);
    show("device API launch (empty)", &m[1]);
    show("checked builder run (empty)", &m[2]);
    show("device API launch (saxpy, 4 args)", &m[3]);
    show("checked builder run (saxpy)", &m[4]);
    show("builder run_unchecked (saxpy)", &m[5]);
    let (lo, hi) = range(&m[0]);
    println!(
        "  ratio Program::launch/direct     {:10.1} .. {:.1}x",
        lo / direct_ns,
        hi / direct_ns
    );
    let d = |name: &str, v: Vec<f64>| {
        let (lo, hi) = range(&v);
        println!("  {name:<32} {lo:+10.1} .. {hi:+.1} ns");
    };
    d("diagnostics off (launch - API)", diff(&m[0], &m[1]));
    d("builder - device API (empty)", diff(&m[2], &m[1]));
    d("builder - device API (saxpy)", diff(&m[4], &m[3]));
    d("unchecked - device API (saxpy)", diff(&m[5], &m[3]));
    d("the check itself (saxpy)", diff(&m[4], &m[5]));
}
