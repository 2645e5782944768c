//! The AMD GPU check: the GPU checks' kernels from code objects (made by the JIT and by clang)
//! and from bitcode on the first AMD GPU, every result compared bit for bit with the host
//! plugin's. Images are prepared where the build tools are, for a list of processors, and run
//! where the GPU is. Used by `scripts/gpu-check.sh amdgpu` (through the `amdgpu-gpu-check`
//! binary), which includes this file as a module (see `gpu_check`).

use offload_tests::gpu_check::{
    EXTRA_KERNELS, Extras, KERNELS, Report, cases, compare_kinds, host_results, run_extras,
};
use offload_tests::{AMDGCN, amdgcn_bitcode, amdgcn_jit, clang, host_kernel, repo_root};
use std::path::Path;

/// The processors images are prepared for by default: AMD's data-centre GPUs of the last
/// generations (MI100, MI200, MI300) and the RDNA 2 and 3 cards ROCm supports.
pub const DEFAULT_PROCESSORS: [&str; 5] = ["gfx908", "gfx90a", "gfx942", "gfx1030", "gfx1100"];

/// Writes every image the check needs into `dir`: `<k>.host.so`, and for each processor
/// `<k>.<gfx>.bc`, `<k>.<gfx>.jit.hsaco` (the JIT and ld.lld) and `<k>.<gfx>.clang.hsaco`
/// (clang's own link). Needs clang-19, ld.lld-19 and the workspace's `offload`.
pub fn prepare(dir: &Path, processors: &[&str]) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let write = |name: String, bytes: &[u8]| {
        std::fs::write(dir.join(&name), bytes).map_err(|e| format!("{name}: {e}"))
    };
    let include = repo_root().join("include");
    let names = KERNELS
        .iter()
        .map(|(k, _)| *k)
        .chain(EXTRA_KERNELS.into_iter().filter(|k| *k != "empty"));
    for k in names {
        if k != "fault" {
            write(format!("{k}.host.so"), &read(&host_kernel(k))?)?;
        }
        for gfx in processors {
            let bc = amdgcn_bitcode(k, gfx);
            write(format!("{k}.{gfx}.bc"), &read(&bc)?)?;
            write(
                format!("{k}.{gfx}.jit.hsaco"),
                &amdgcn_jit(&bc, gfx, &[], &format!("gpu-check-{k}-{gfx}")),
            )?;
            let out = dir.join(format!("{k}.{gfx}.clang.hsaco"));
            let src = repo_root().join("kernels").join(format!("{k}.c"));
            clang(&[
                "-O2",
                "-ffp-contract=off",
                "-target",
                AMDGCN,
                &format!("-mcpu={gfx}"),
                "-nogpulib",
                "-I",
                include.to_str().unwrap(),
                src.to_str().unwrap(),
                "-o",
                out.to_str().unwrap(),
            ]);
        }
    }
    Ok(())
}

fn read(p: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))
}

/// Runs the check on `amdgpu:0` against `host:0` with the images in `dir`, one report line
/// per kernel and image kind, then the checks beyond the kernels ([`run_extras`]); `offload`
/// is the command the faulting kernel runs in.
pub fn run(dir: &Path, runtime: &offload::Runtime, offload: &Path) -> Result<Report, String> {
    let gpu = runtime
        .device("amdgpu", 0)
        .map_err(|e| format!("no AMD GPU: {e}"))?;
    let info = gpu.info().map_err(|e| e.to_string())?;
    let gfx = info.compute_unit_kind.clone();
    println!(
        "device   amdgpu:0  {}  compute unit {} ({})  {} compute units",
        info.name, gfx, info.target_features, info.compute_units
    );
    if !dir.join(format!("saxpy.{gfx}.bc")).exists() {
        return Err(format!(
            "no images were prepared for {gfx}: run `amdgpu-gpu-check prepare DIR {gfx}` (or \
             OFFLOAD_GPU_CHECK_PROCESSORS={gfx} scripts/gpu-check.sh amdgpu prepare)"
        ));
    }
    let jit = runtime.plugin("amdgpu").map_err(|e| e.to_string())?;
    let mut report = Report::default();
    // 64 KiB of LDS per work-group on the GPUs ROCm supports here.
    for case in cases(64 << 10) {
        let k = case.kernel;
        let want = host_results(runtime, dir, &case)?;
        let kinds = vec![
            (
                "code object (JIT)".to_string(),
                read(&dir.join(format!("{k}.{gfx}.jit.hsaco")))?,
            ),
            (
                "code object (clang)".to_string(),
                read(&dir.join(format!("{k}.{gfx}.clang.hsaco")))?,
            ),
            (
                format!("bitcode {gfx}"),
                read(&dir.join(format!("{k}.{gfx}.bc")))?,
            ),
        ];
        compare_kinds(&mut report, &gpu, Some(jit), &case, &want, kinds);
    }
    let extras = Extras {
        add_k: read(&dir.join(format!("add_k.{gfx}.jit.hsaco")))?,
        fault: dir.join(format!("fault.{gfx}.jit.hsaco")),
        offload: offload.to_path_buf(),
        fault_says: "memory access fault by the GPU",
    };
    run_extras(&mut report, &gpu, &extras);
    Ok(report)
}
