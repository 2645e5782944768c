//! The CUDA GPU check: the host tests' kernels (saxpy, 2-D stencil, the 16-argument kernel,
//! atomics, 3-D ids) from cubin, PTX, fatbin and bitcode images on a CUDA device, every result
//! compared bit for bit with the host plugin's; then the launch overhead against a raw `cudarc`
//! launch, and the JIT times. Images are prepared where the build tools are (clang-19, the JIT,
//! ptxas) and run where the GPU is, which needs only the NVIDIA driver and the files prepared.
//!
//! Used by `scripts/gpu-check.sh cuda` (through the `cuda-gpu-check` binary) and by the
//! `#[ignore]`d GPU test in `tests/tests/cuda.rs`, which include this file as a module: it links
//! the cuda plugin as a library, and one program can hold only one backend library (each
//! defines the `offload_plugin_entry` symbol), so it is not part of the `offload_tests` library.

use offload::LaunchDims;
use offload_cuda::fatbin::{self, EntryKind};
use offload_cuda::sm::Sm;
use offload_tests::gpu_check::{
    EXTRA_KERNELS, Extras, KERNELS, Report, cases, compare_kinds, host_results, per_call_us,
    run_extras,
};
use offload_tests::{host_kernel, nvptx_bitcode, nvptx_jit, ptxas_cubin};
use std::path::Path;

/// The SM the PTX and bitcode are built for: old enough that every current GPU runs it.
pub const BASE_SM: &str = "sm_80";

/// The SMs cubins are prepared for (the H200's `sm_90a`, and `sm_90`).
pub const CUBIN_SMS: [&str; 2] = ["sm_90a", "sm_90"];

/// Writes every image the check needs into `dir`: `<k>.host.so`, `<k>.bc` and `<k>.ptx` (for
/// [`BASE_SM`]), `<k>.<sm>.cubin` for each of `sms` and for [`BASE_SM`], and `empty.*` for the
/// launch benchmark. Needs clang-19, the workspace's `offload` and ptxas (the test helpers').
pub fn prepare(dir: &Path, sms: &[&str]) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let write = |name: String, bytes: &[u8]| {
        std::fs::write(dir.join(&name), bytes).map_err(|e| format!("{name}: {e}"))
    };
    let mut names: Vec<&str> = KERNELS.iter().map(|(k, _)| *k).collect();
    names.extend(EXTRA_KERNELS);
    for k in names {
        if k != "fault" {
            write(format!("{k}.host.so"), &read(&host_kernel(k))?)?;
        }
        let bc = nvptx_bitcode(k, BASE_SM);
        write(format!("{k}.bc"), &read(&bc)?)?;
        let ptx = nvptx_jit(&bc, BASE_SM, &["--emit-ptx"], &format!("gpu-check-{k}"));
        write(format!("{k}.ptx"), &ptx)?;
        let mut all = sms.to_vec();
        all.push(BASE_SM);
        for sm in all {
            write(
                format!("{k}.{sm}.cubin"),
                &ptxas_cubin(&ptx, sm, &format!("gpu-check-{k}")),
            )?;
        }
    }
    Ok(())
}

fn read(p: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))
}

/// Runs the check on `cuda:0` against `host:0` with the images in `dir`, one report line per
/// kernel and image kind, then the checks beyond the kernels ([`run_extras`]); `offload` is
/// the command the faulting kernel runs in.
pub fn run(dir: &Path, runtime: &offload::Runtime, offload: &Path) -> Result<Report, String> {
    let gpu = runtime
        .device("cuda", 0)
        .map_err(|e| format!("no CUDA device: {e}"))?;
    let info = gpu.info().map_err(|e| e.to_string())?;
    let sm = Sm::parse(&info.compute_unit_kind).ok_or("the device has no SM architecture")?;
    println!(
        "device   cuda:0  {}  compute unit {}  {} multiprocessors",
        info.name, info.compute_unit_kind, info.compute_units
    );
    let jit = runtime.plugin("cuda").map_err(|e| e.to_string())?;
    let mut report = Report::default();
    // Any opt-in size fits the cases on a data-centre GPU; the plugin refuses what does not.
    for case in cases(u32::MAX) {
        let k = case.kernel;
        let want = host_results(runtime, dir, &case)?;
        let ptx = read(&dir.join(format!("{k}.ptx")))?;
        let base_cubin = read(&dir.join(format!("{k}.{BASE_SM}.cubin")))?;
        let own_cubin = read(&dir.join(format!("{k}.{sm}.cubin"))).ok();
        let mut entries: Vec<(EntryKind, u32, &[u8])> = vec![
            (EntryKind::Ptx, 80, &ptx),
            (EntryKind::Cubin, 80, &base_cubin),
        ];
        if let Some(c) = &own_cubin {
            entries.push((EntryKind::Cubin, sm.number(), c));
        }
        let fat = fatbin::build(&entries);
        let mut kinds: Vec<(String, Vec<u8>)> = Vec::new();
        match &own_cubin {
            Some(c) => kinds.push((format!("cubin {sm}"), c.clone())),
            None => println!("{k:10} no cubin prepared for {sm}: the fatbin gives it PTX"),
        }
        kinds.push((format!("PTX {BASE_SM}"), ptx.clone()));
        kinds.push(("fatbin".into(), fat));
        kinds.push((
            format!("bitcode {BASE_SM} (JIT for {sm})"),
            read(&dir.join(format!("{k}.bc")))?,
        ));
        compare_kinds(&mut report, &gpu, Some(jit), &case, &want, kinds);
    }
    let own = |k: &str| {
        let cubin = dir.join(format!("{k}.{sm}.cubin"));
        if cubin.exists() {
            cubin
        } else {
            dir.join(format!("{k}.ptx"))
        }
    };
    let extras = Extras {
        add_k: read(&own("add_k"))?,
        fault: own("fault"),
        offload: offload.to_path_buf(),
        fault_says: "CUDA_ERROR_ILLEGAL_ADDRESS",
    };
    run_extras(&mut report, &gpu, &extras);
    Ok(report)
}

/// The offload side of the launch benchmark: the empty kernel's cubin on `cuda:0`, launched
/// `n` times synchronously, then `n` times on a queue with one wait; per-launch µs of each.
pub fn offload_launch_us(
    runtime: &offload::Runtime,
    cubin: &[u8],
    n: u32,
) -> Result<(f64, f64), String> {
    let gpu = runtime.device("cuda", 0).map_err(|e| e.to_string())?;
    let program = gpu.load(cubin).map_err(|e| e.to_string())?;
    let kernel = program.kernel("empty").map_err(|e| e.to_string())?;
    let dims = LaunchDims::linear(1, 1);
    let sync = per_call_us(n, || {
        // SAFETY: the buffers are as long as the kernel touches for these arguments.
        unsafe { program.launch(&kernel, &dims, &[]) }.unwrap()
    });
    // SAFETY: the device API is used on this test's own allocations only, with no HostBuffer or safe-layer queue on them.
    let raw = unsafe { gpu.raw() };
    let queue = raw.queue_create().map_err(|e| e.to_string())?;
    let queued = per_call_us(1, || {
        for _ in 0..n {
            raw.launch(kernel.handle(), &dims, &[], Some(queue))
                .unwrap();
        }
        raw.queue_synchronize(queue).unwrap();
    }) / f64::from(n);
    raw.queue_destroy(queue).map_err(|e| e.to_string())?;
    Ok((sync, queued))
}
