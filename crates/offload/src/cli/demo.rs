//! `offload demo`: saxpy on the host backend with an embedded kernel, verified against a CPU
//! reference, with the time of every step.

use super::{Failure, human_bytes, ms_since};
use offload::{KernelArg, LaunchDims, PluginStatus, Runtime};
use std::time::Instant;

/// The demo kernel (`kernels/saxpy.c`), compiled for this machine by build.rs.
static KERNEL: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/demo_saxpy.so"));
const BLOCK: u32 = 256;

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn demo(n: u32) -> Result<(), Failure> {
    if n == 0 {
        return Err(Failure::Usage("--n must be at least 1".into()));
    }
    let started = Instant::now();
    println!("offload demo: y = a*x + y (saxpy) on the host backend, n = {n}, block {BLOCK}");

    let t = Instant::now();
    let rt = Runtime::from_env();
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
    println!(
        "  discover  {} plugin(s), host plugin {} with {count} device(s)   {:8.3} ms",
        rt.plugins().len(),
        host.path().display(),
        ms_since(t)
    );

    let device = host.device(0)?;
    let info = device.info()?;
    println!(
        "  device    {device}: {} (compute unit {})",
        info.name, info.compute_unit_kind
    );

    let t = Instant::now();
    let program = device.load(KERNEL)?;
    let kernel = program.kernel("saxpy")?;
    println!(
        "  load      embedded kernel image, {} (built with {})   {:8.3} ms",
        human_bytes(KERNEL.len() as u64),
        env!("OFFLOAD_DEMO_KERNEL_CC"),
        ms_since(t)
    );

    let a = 2.5f32;
    let x: Vec<f32> = (0..n).map(|i| (i % 1000) as f32 * 0.5).collect();
    let y: Vec<f32> = (0..n).map(|i| 1.0 - (i % 77) as f32).collect();
    let bytes = u64::from(n) * 4;
    let t = Instant::now();
    let dx = device.alloc_buffer(bytes)?;
    let dy = device.alloc_buffer(bytes)?;
    dx.write(&f32_bytes(&x))?;
    dy.write(&f32_bytes(&y))?;
    println!(
        "  copy-in   2 x {}   {:8.3} ms",
        human_bytes(bytes),
        ms_since(t)
    );

    let dims = LaunchDims::linear(n.div_ceil(BLOCK), BLOCK);
    let t = Instant::now();
    program.launch(
        kernel,
        &dims,
        &[
            KernelArg::I32(n as i32),
            KernelArg::F32(a),
            KernelArg::Ptr(dx.ptr()),
            KernelArg::Ptr(dy.ptr()),
        ],
    )?;
    println!(
        "  launch    {dims}, {} work items   {:8.3} ms",
        u64::from(n.div_ceil(BLOCK)) * u64::from(BLOCK),
        ms_since(t)
    );

    let t = Instant::now();
    let mut out = vec![0u8; bytes as usize];
    dy.read(&mut out)?;
    println!(
        "  copy-out  {}   {:8.3} ms",
        human_bytes(bytes),
        ms_since(t)
    );

    let t = Instant::now();
    let got: Vec<f32> = out
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let wrong: Vec<usize> = (0..n as usize)
        .filter(|&i| got[i].to_bits() != (a * x[i] + y[i]).to_bits())
        .collect();
    println!(
        "  verify    {} of {n} elements equal the CPU reference bit for bit   {:8.3} ms",
        n as usize - wrong.len(),
        ms_since(t)
    );
    if let Some(&i) = wrong.first() {
        return Err(Failure::Runtime(format!(
            "demo result is wrong at {} element(s); first at index {i}: got {}, expected {}",
            wrong.len(),
            got[i],
            a * x[i] + y[i]
        )));
    }
    println!(
        "result: PASS (y[0] = {}, y[{}] = {}), total {:.3} ms",
        got[0],
        n - 1,
        got[n as usize - 1],
        ms_since(started)
    );
    Ok(())
}
