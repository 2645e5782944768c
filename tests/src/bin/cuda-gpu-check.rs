//! The CUDA GPU check (see `tests/src/cuda_check.rs` and `scripts/gpu-check.sh cuda`).
//!
//!     cuda-gpu-check prepare DIR      where the build tools are: writes the images into DIR
//!     cuda-gpu-check run DIR [N]      where the GPU is: every kernel from every image kind
//!                                     against the host, then N launches (default 20000) of an
//!                                     empty kernel through offload and through raw cudarc
//!
//! The plugins and the JIT worker are looked for next to this executable.

#[path = "../cuda_check.rs"]
mod cuda_check;

use std::path::PathBuf;
use std::process::ExitCode;

fn raw_cudarc_launch_us(cubin: Vec<u8>, n: u32) -> Result<(f64, f64), String> {
    use cudarc::driver::{CudaContext, LaunchConfig};
    let ctx = CudaContext::new(0).map_err(|e| format!("cudarc: {e}"))?;
    let module = ctx
        .load_module(cudarc::nvrtc::Ptx::from_binary(cubin))
        .map_err(|e| format!("cudarc: {e}"))?;
    let f = module
        .load_function("empty")
        .map_err(|e| format!("cudarc: {e}"))?;
    let stream = ctx.default_stream();
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    };
    let sync = offload_tests::gpu_check::per_call_us(n, || {
        // SAFETY: `empty` takes no parameters.
        unsafe { stream.launch_builder(&f).launch(cfg) }.unwrap();
        stream.synchronize().unwrap();
    });
    let queued = offload_tests::gpu_check::per_call_us(1, || {
        for _ in 0..n {
            // SAFETY: as above.
            unsafe { stream.launch_builder(&f).launch(cfg) }.unwrap();
        }
        stream.synchronize().unwrap();
    }) / f64::from(n);
    Ok((sync, queued))
}

fn run(dir: PathBuf, n: u32) -> Result<(), String> {
    let (exe_dir, runtime) = offload_tests::gpu_check::runtime_beside_exe()?;
    let mut report = cuda_check::run(&dir, &runtime, &exe_dir.join("offload"))?;
    let device_sm = runtime
        .device("cuda", 0)
        .and_then(|d| d.info())
        .map(|i| i.compute_unit_kind)
        .map_err(|e| e.to_string())?;
    let cubin = ["sm_90a", "sm_90", cuda_check::BASE_SM]
        .iter()
        .map(|sm| dir.join(format!("empty.{sm}.cubin")))
        .find(|p| p.exists())
        .ok_or("no empty.*.cubin prepared")?;
    let own = dir.join(format!("empty.{device_sm}.cubin"));
    let cubin = std::fs::read(&own)
        .or_else(|_| std::fs::read(&cubin))
        .map_err(|e| e.to_string())?;
    report.run("launch overhead, empty kernel, against raw cudarc", || {
        let (o_sync, o_queued) = cuda_check::offload_launch_us(&runtime, &cubin, n)?;
        if let Ok(driver) = std::env::var("OFFLOAD_CUDA_DRIVER") {
            // cudarc loads the system's driver by its own names, which need not be this one.
            return Ok(format!(
                "offload {o_sync:.2} us (launch + wait), {o_queued:.2} us (queued); no raw cudarc reference: OFFLOAD_CUDA_DRIVER={driver}"
            ));
        }
        let (c_sync, c_queued) = raw_cudarc_launch_us(cubin.clone(), n)?;
        Ok(format!(
            "best of 5 x {n}: launch + wait offload {o_sync:.2} us, cudarc {c_sync:.2} us ({:.2}x); {n} queued + 1 wait offload {o_queued:.2} us, cudarc {c_queued:.2} us ({:.2}x)",
            o_sync / c_sync,
            o_queued / c_queued
        ))
    });
    if let Ok(slot) = runtime.plugin("cuda")
        && let Some(j) = slot.jit_stats()
    {
        println!(
            "JIT      {} compiles in {:.1} ms ({:.1} ms each on average; the first includes starting the worker)",
            j.compiles,
            j.compile_ns as f64 / 1e6,
            j.compile_ns as f64 / 1e6 / j.compiles.max(1) as f64
        );
    }
    offload_tests::gpu_check::finish(&report, &runtime, "cuda", &dir)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["prepare", dir] => cuda_check::prepare(&PathBuf::from(dir), &cuda_check::CUBIN_SMS),
        ["run", dir] => run(PathBuf::from(dir), 20_000),
        ["run", dir, n] => match n.parse() {
            Ok(n) if n > 0 => run(PathBuf::from(dir), n),
            _ => Err(format!("'{n}' is not a positive number of launches")),
        },
        _ => {
            eprintln!("usage: cuda-gpu-check prepare DIR | run DIR [LAUNCHES]");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cuda-gpu-check: {e}");
            ExitCode::FAILURE
        }
    }
}
