//! `offload demo`: saxpy on the host backend with an embedded kernel, verified against a CPU
//! reference, with the time of every step.

use super::out::outln;
use super::{Failure, human_bytes, ms_since};
use offload::{LaunchDims, PluginStatus, Runtime};
use std::time::Instant;

/// The demo kernel (`kernels/saxpy.c`), compiled for this machine by build.rs (offload-build's
/// container, holding the host shared object).
static KERNEL: &[u8] = offload::include_kernels!("demo_saxpy");
const BLOCK: u32 = 256;

/// An empty vector with room for `n` elements, or an out-of-memory failure naming `what`.
fn reserve<T>(n: usize, what: &str) -> Result<Vec<T>, Failure> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| {
        Failure::Runtime(format!(
            "out of memory: {what} needs {} on the host",
            human_bytes((n as u64).saturating_mul(std::mem::size_of::<T>() as u64))
        ))
    })?;
    Ok(v)
}

pub fn demo(n: u32) -> Result<(), Failure> {
    if n == 0 {
        return Err(Failure::Usage("--n must be at least 1".into()));
    }
    let started = Instant::now();
    outln!("offload demo: y = a*x + y (saxpy) on the host backend, n = {n}, block {BLOCK}");

    let t = Instant::now();
    let rt = Runtime::from_env().map_err(Failure::input)?;
    let host = rt.plugin("host").map_err(|e| {
        Failure::Runtime(format!(
            "{e}; the host plugin (liboffload_plugin_host.so) must sit next to the offload \
             executable or in OFFLOAD_PLUGIN_PATH (build it with `cargo build --workspace`)"
        ))
    })?;
    let status = host.status();
    let PluginStatus::Ok(count) = status else {
        return Err(Failure::Runtime(format!(
            "host plugin is {}: {}",
            status.label(),
            status.reason().unwrap_or("")
        )));
    };
    outln!(
        "  discover  {} plugin(s), host plugin {} with {count} device(s)   {:8.3} ms",
        rt.plugins().len(),
        host.path().display(),
        ms_since(t)
    );

    let device = host.device(0)?;
    let info = device.info()?;
    outln!(
        "  device    {device}: {} (compute unit {})",
        info.name,
        info.compute_unit_kind
    );

    let t = Instant::now();
    // SAFETY: the demo's own kernel, compiled into this binary by its build script from
    // kernels/saxpy.c, whose parameter record is written beside its code.
    let program = unsafe { device.load_trusted(KERNEL) }?;
    let kernel = program.kernel("saxpy")?;
    outln!(
        "  load      embedded kernel image, {} (built with {})   {:8.3} ms",
        human_bytes(KERNEL.len() as u64),
        env!("OFFLOAD_DEMO_KERNEL_CC"),
        ms_since(t)
    );

    // x, y, their bytes, the result's bytes and floats on the host, x and y on the device:
    // refused up front when it is more than the machine has (allocations of that size would
    // succeed on paper and then take the machine down).
    let need = 8 * 4 * u64::from(n);
    let physical = offload_core::fs::physical_memory();
    if physical > 0 && need > physical {
        return Err(Failure::Runtime(format!(
            "out of memory: --n {n} needs about {} of memory, this machine has {}",
            human_bytes(need),
            human_bytes(physical)
        )));
    }
    let a = 2.5f32;
    let mut x: Vec<f32> = reserve(n as usize, "--n")?;
    x.extend((0..n).map(|i| (i % 1000) as f32 * 0.5));
    let mut y: Vec<f32> = reserve(n as usize, "--n")?;
    y.extend((0..n).map(|i| 1.0 - (i % 77) as f32));
    let bytes = u64::from(n) * 4;
    let t = Instant::now();
    let dx = device.upload(&x)?;
    let mut dy = device.upload(&y)?;
    outln!(
        "  copy-in   2 x {}   {:8.3} ms",
        human_bytes(bytes),
        ms_since(t)
    );

    let dims = LaunchDims::linear(n.div_ceil(BLOCK), BLOCK);
    let t = Instant::now();
    // Checked against the kernel's OFFLOAD_PARAMS record: x and y must hold n floats.
    kernel
        .launch(dims)
        .arg(n as i32)
        .arg(a)
        .arg(&dx)
        .arg(&mut dy)
        .run()?;
    outln!(
        "  launch    {dims}, {} work items   {:8.3} ms",
        u64::from(n.div_ceil(BLOCK)) * u64::from(BLOCK),
        ms_since(t)
    );

    let t = Instant::now();
    let mut got: Vec<f32> = reserve(n as usize, "--n")?;
    got.resize(n as usize, 0.0);
    dy.read(&mut got)?;
    outln!(
        "  copy-out  {}   {:8.3} ms",
        human_bytes(bytes),
        ms_since(t)
    );

    let t = Instant::now();
    let is_wrong = |i: &usize| got[*i].to_bits() != (a * x[*i] + y[*i]).to_bits();
    let wrong = (0..n as usize).filter(is_wrong).count();
    outln!(
        "  verify    {} of {n} elements equal the CPU reference bit for bit   {:8.3} ms",
        n as usize - wrong,
        ms_since(t)
    );
    if let Some(i) = (0..n as usize).find(is_wrong) {
        return Err(Failure::Runtime(format!(
            "demo result is wrong at {wrong} element(s); first at index {i}: got {}, expected {}",
            got[i],
            a * x[i] + y[i]
        )));
    }
    outln!(
        "result: PASS (y[0] = {}, y[{}] = {}), total {:.3} ms",
        got[0],
        n - 1,
        got[n as usize - 1],
        ms_since(started)
    );
    Ok(())
}
