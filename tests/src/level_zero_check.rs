//! The Level Zero (Intel GPU) check: saxpy from SPIR-V compared bit for bit with the host plugin,
//! a work-group reversal through `__local` memory and a barrier, then the checks beyond the
//! kernels ([`run_extras`]: overlapping device copies, queued work from several threads, events,
//! the kernel's parameter record as a global, host and shared memory, a kernel that faults).
//! The SPIR-V is assembled from `tests/spirv/` where the build tools are (spirv-as), and run
//! where the GPU is, which needs only the Level Zero loader and a GPU driver.
//!
//! Used by `scripts/gpu-check.sh level-zero` (through the `level-zero-gpu-check` binary), which
//! includes this file as a module.

use offload::{KernelArg, LaunchDims};
use offload_tests::gpu_check::{
    Extras, Report, cases, compare_kinds, dry_run, host_results, run_extras,
};
use offload_tests::{host_kernel, spirv};
use std::path::Path;

/// The SPIR-V modules the check runs.
pub const MODULES: [&str; 4] = ["saxpy", "add_k", "reverse", "fault"];

/// Writes `<k>.spv` for each of [`MODULES`] and `saxpy.host.so` into `dir`.
pub fn prepare(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for k in MODULES {
        std::fs::write(dir.join(format!("{k}.spv")), spirv(k)).map_err(|e| e.to_string())?;
    }
    let so = std::fs::read(host_kernel("saxpy")).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("saxpy.host.so"), so).map_err(|e| e.to_string())
}

fn read(p: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))
}

/// Runs the check on `level-zero:0` with the images in `dir`; `offload` is the command the
/// faulting kernel runs in.
pub fn run(dir: &Path, runtime: &offload::Runtime, offload: &Path) -> Result<Report, String> {
    let gpu = runtime
        .device("level-zero", 0)
        .map_err(|e| format!("no Level Zero GPU: {e}"))?;
    let info = gpu.info().map_err(|e| e.to_string())?;
    println!(
        "device   level-zero:0  {}  compute unit {}  {} EUs",
        info.name, info.compute_unit_kind, info.compute_units
    );
    let mut report = Report::default();
    let saxpy = cases(u32::MAX)
        .into_iter()
        .find(|c| c.kernel == "saxpy")
        .ok_or("no saxpy case")?;
    let want = host_results(runtime, dir, &saxpy)?;
    compare_kinds(
        &mut report,
        &gpu,
        None,
        &saxpy,
        &want,
        vec![("SPIR-V".into(), read(&dir.join("saxpy.spv"))?)],
    );
    let reverse = read(&dir.join("reverse.spv"))?;
    report.run(
        "reverse through __local memory and a barrier (4096 groups of 256)",
        || reverse_check(&gpu, &reverse),
    );
    let extras = Extras {
        add_k: read(&dir.join("add_k.spv"))?,
        fault: dir.join("fault.spv"),
        offload: offload.to_path_buf(),
        fault_says: "ZE_RESULT_ERROR_DEVICE_LOST",
    };
    run_extras(&mut report, &gpu, &extras);
    Ok(report)
}

fn reverse_check(gpu: &offload::Device, image: &[u8]) -> Result<String, String> {
    let (groups, l) = (4096usize, 256usize);
    let program = offload_tests::load(gpu, image).map_err(|e| e.to_string())?;
    let k = program.kernel("reverse").map_err(|e| e.to_string())?;
    let input: Vec<u32> = (0..(groups * l) as u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    let inb = gpu.upload(&input).map_err(|e| e.to_string())?;
    let out = gpu.alloc::<u32>(groups * l).map_err(|e| e.to_string())?;
    // SAFETY: both buffers hold groups * l words, all the kernel touches.
    unsafe {
        k.launch(LaunchDims::linear(groups as u32, l as u32))
            .args_raw(&[
                KernelArg::Ptr(inb.ptr()),
                KernelArg::Ptr(out.ptr()),
                KernelArg::U32((l * 4) as u32),
            ])
            .unchecked()
            .run()
    }
    .map_err(|e| e.to_string())?;
    let got = out.to_vec().map_err(|e| e.to_string())?;
    for g in 0..groups {
        for i in 0..l {
            let want = input[g * l + l - 1 - i];
            if got[g * l + i] != want {
                return Err(format!(
                    "group {g} item {i}: {:#x}, want {want:#x}",
                    got[g * l + i]
                ));
            }
        }
    }
    Ok(format!(
        "every group reversed{}",
        if dry_run() {
            " (by the fake driver)"
        } else {
            ""
        }
    ))
}
