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
    Case, EXTRA_KERNELS, Extras, KERNELS, Report, cases, compare_kinds, dry_run, heavy_case,
    host_results, per_call_us, run_case, run_extras,
};
use offload_tests::{host_kernel, nvptx_bitcode, nvptx_jit, ptxas_cubin};
use std::path::{Path, PathBuf};

/// The SM the PTX and bitcode are built for: old enough that every current GPU runs it.
pub const BASE_SM: &str = "sm_80";

/// The SMs cubins are prepared for (the H200's `sm_90a`, and `sm_90`).
pub const CUBIN_SMS: [&str; 2] = ["sm_90a", "sm_90"];

/// The kernels only the CUDA check runs: `heavy`, whose registers limit its block size.
pub const CUDA_KERNELS: [&str; 1] = ["heavy"];

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
    names.extend(CUDA_KERNELS);
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
    run_cuda_extras(&mut report, runtime, &gpu, dir, sm, offload);
    Ok(report)
}

/// The image of kernel `k` for the device: its own SM's cubin, else the base SM's.
fn cubin_for(dir: &Path, k: &str, sm: Sm) -> Result<Vec<u8>, String> {
    read(&dir.join(format!("{k}.{sm}.cubin")))
        .or_else(|_| read(&dir.join(format!("{k}.{BASE_SM}.cubin"))))
}

/// The checks only a CUDA device needs, each against the real driver: a kernel whose registers
/// limit its block (refused above the limit with the driver's number, equal to the host at
/// it); launches one argument short refused with the sizes `cuFuncGetParamInfo` gives; one
/// kernel launched from two threads with 64 KiB and 100 KiB of dynamic shared memory (the
/// opt-in attribute never lowered under the other); fat binaries made by NVIDIA's own
/// `fatbinary` (plain and compressed), where the GPU machine has one; and the toolkit's stub
/// library on the loader path, where the machine has one.
pub fn run_cuda_extras(
    report: &mut Report,
    runtime: &offload::Runtime,
    gpu: &offload::Device,
    dir: &Path,
    sm: Sm,
    offload: &Path,
) {
    report.run(
        "a register-heavy kernel: 1024 threads refused, its own limit runs",
        || {
            let cubin = cubin_for(dir, "heavy", sm)?;
            let too_many = heavy_case(1024);
            let limit = match run_case(gpu, &cubin, &too_many) {
                Ok(_) => {
                    return Err("1024 threads per block were accepted: the kernel was meant to \
                                need more registers than that allows"
                        .into());
                }
                Err(e) => e
                    .split("runs at most ")
                    .nth(1)
                    .and_then(|r| r.split(' ').next())
                    .and_then(|n| n.parse::<u32>().ok())
                    .ok_or(format!("refused, but not for its thread limit: {e}"))?,
            };
            if limit == 0 || limit >= 1024 {
                return Err(format!("the driver's limit {limit} is not below 1024"));
            }
            let at_limit = heavy_case(limit);
            let want = host_results(runtime, dir, &at_limit)?;
            let got = run_case(gpu, &cubin, &at_limit)?;
            if got != want && dry_run() {
                return Ok(format!("limit {limit} threads; results not compared (dry run)"));
            }
            if got != want {
                return Err(format!("at {limit} threads per block the results differ from the host's"));
            }
            Ok(format!("limit {limit} threads (CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK); at it, equal to the host"))
        },
    );

    let args16 = cases(u32::MAX)
        .into_iter()
        .find(|c| c.kernel == "args16")
        .expect("args16 is a case");
    let sizes = args16.arg_sizes();
    let want_refusal = format!(
        "takes {} argument(s) (of {} bytes)",
        sizes.len(),
        sizes
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    let short = args16.one_argument_short();
    report.run("a launch one argument short refused (cubin, PTX)", || {
        let cubin = cubin_for(dir, "args16", sm)?;
        if offload_cuda::params::from_cubin(&cubin, "args16").as_ref() != Some(&sizes) {
            return Err("the cubin's .nv.info does not give the kernel's parameter sizes".into());
        }
        for (kind, image) in [("cubin", cubin), ("PTX", read(&dir.join("args16.ptx"))?)] {
            refused(gpu, &image, &short, &want_refusal).map_err(|e| format!("{kind}: {e}"))?;
        }
        Ok(format!("the driver's parameter sizes: '{want_refusal}'"))
    });

    report.run(
        "dynamic shared memory from 2 threads: 64 KiB and 100 KiB launches",
        || two_threads_dynamic_shared(gpu, &cubin_for(dir, "shared_reverse", sm)?),
    );

    match nvidia_fatbinary() {
        None => report.skipped(
            "fat binaries from NVIDIA's fatbinary",
            "no fatbinary on PATH or in /usr/local/cuda/bin",
        ),
        Some(tool) => real_fatbins(
            report,
            runtime,
            gpu,
            dir,
            &tool,
            &args16,
            &short,
            &want_refusal,
        ),
    }

    match stub_dir() {
        None => report.skipped(
            "the toolkit's stub libcuda.so on the loader path",
            "no CUDA toolkit stub directory on this machine",
        ),
        Some(stubs) => report.run("the toolkit's stub libcuda.so on the loader path", || {
            stub_library(offload, &stubs)
        }),
    }
}

/// Launches `case` from `image` and expects a refusal whose message holds `says`.
fn refused(gpu: &offload::Device, image: &[u8], case: &Case, says: &str) -> Result<(), String> {
    match run_case(gpu, image, case) {
        Ok(_) => Err("the launch was accepted".into()),
        Err(e) if e.contains(says) => Ok(()),
        Err(e) => Err(format!("refused, but not with '{says}': {e}")),
    }
}

fn two_threads_dynamic_shared(gpu: &offload::Device, cubin: &[u8]) -> Result<String, String> {
    use offload::KernelArg;
    let program = offload_tests::load(gpu, cubin).map_err(|e| e.to_string())?;
    let kernel = program
        .kernel("shared_reverse")
        .map_err(|e| e.to_string())?;
    let (per_block, blocks, rounds) = (16384usize, 32usize, 100);
    let n = per_block * blocks;
    let input: Vec<u32> = (0..n as u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    let x = gpu.alloc::<u32>(n).map_err(|e| e.to_string())?;
    x.write(&input).map_err(|e| e.to_string())?;
    std::thread::scope(|s| {
        let threads: Vec<_> = [64u32 << 10, 100 << 10]
            .into_iter()
            .map(|bytes| {
                let (kernel, x, input) = (&kernel, &x, &input);
                s.spawn(move || -> Result<(), String> {
                    let out = gpu.alloc::<u32>(n).map_err(|e| e.to_string())?;
                    let dims = LaunchDims {
                        grid: [blocks as u32, 1, 1],
                        block: [512, 1, 1],
                        shared_mem_bytes: bytes,
                    };
                    let args = [
                        KernelArg::Ptr(x.ptr()),
                        KernelArg::Ptr(out.ptr()),
                        KernelArg::I32(per_block as i32),
                    ];
                    for r in 0..rounds {
                        out.fill(0).map_err(|e| e.to_string())?;
                        // SAFETY: both buffers hold blocks * per_block words, all the kernel touches.
                        unsafe { kernel.launch(dims).args_raw(&args).unchecked().run() }
                            .map_err(|e| format!("{} KiB, launch {r}: {e}", bytes >> 10))?;
                        let got = out.to_vec().map_err(|e| e.to_string())?;
                        if dry_run() {
                            // The fake driver does not run the kernel.
                            continue;
                        }
                        for b in 0..blocks {
                            for j in 0..per_block {
                                let want = input[b * per_block + per_block - 1 - j];
                                if got[b * per_block + j] != want {
                                    return Err(format!(
                                        "{} KiB, launch {r}: word {j} of block {b} is {:#x}, want {want:#x}",
                                        bytes >> 10,
                                        got[b * per_block + j]
                                    ));
                                }
                            }
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().unwrap_or_else(|_| Err("a thread panicked".into())))
            .collect::<Result<Vec<()>, String>>()
    })?;
    Ok(format!(
        "{rounds} launches each{}",
        if dry_run() {
            "; results not compared (dry run)"
        } else {
            ", every result reversed"
        }
    ))
}

/// NVIDIA's `fatbinary`: on PATH, else in /usr/local/cuda/bin.
fn nvidia_fatbinary() -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain([PathBuf::from("/usr/local/cuda/bin")])
        .map(|d| d.join("fatbinary"))
        .find(|p| p.is_file())
}

/// Fat binaries of saxpy and args16 made by NVIDIA's `fatbinary` from the prepared sm_90 cubin
/// and sm_80 PTX, once per compression setting the tool accepts: each one's entries as the
/// plugin's parser reads them, its results equal to the host's, and (args16) a launch one
/// argument short refused (a compressed entry: the sizes come from the driver alone).
#[expect(
    clippy::too_many_arguments,
    reason = "the check's context, passed through"
)]
fn real_fatbins(
    report: &mut Report,
    runtime: &offload::Runtime,
    gpu: &offload::Device,
    dir: &Path,
    tool: &Path,
    args16: &Case,
    short: &Case,
    want_refusal: &str,
) {
    let version = std::process::Command::new(tool)
        .arg("--version")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .last()
                .unwrap_or_default()
                .to_string()
        })
        .unwrap_or_default();
    println!("fatbinary {}  ({version})", tool.display());
    let work = std::env::temp_dir().join(format!("offload-gpu-check-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&work) {
        report.record(
            "fat binaries from NVIDIA's fatbinary",
            0.0,
            Err(e.to_string()),
        );
        return;
    }
    let saxpy = cases(u32::MAX)
        .into_iter()
        .find(|c| c.kernel == "saxpy")
        .expect("saxpy is a case");
    for setting in [
        "",
        "--compress=false",
        "--compress-all",
        "--compress-mode=size",
    ] {
        for case in [&saxpy, args16] {
            let k = case.kernel;
            let check = format!(
                "{k} from NVIDIA's fatbinary ({})",
                if setting.is_empty() {
                    "its default"
                } else {
                    setting
                }
            );
            let out = work.join(format!("{k}{setting}.fatbin"));
            let cubin = dir.join(format!("{k}.sm_90.cubin"));
            let ptx = dir.join(format!("{k}.ptx"));
            let made = make_fatbin(tool, &out, &cubin, &ptx, setting);
            let image = match made.and_then(|()| read(&out)) {
                Ok(image) => image,
                Err(e) => {
                    report.skipped(&check, &format!("fatbinary refused it: {e}"));
                    continue;
                }
            };
            report.run(&check, || {
                let entries = fatbin::entries(&image).map_err(|e| format!("the parser: {e}"))?;
                let labels: Vec<String> = entries.iter().map(|e| e.label()).collect();
                let kinds: Vec<(EntryKind, u32)> =
                    entries.iter().map(|e| (e.kind, e.sm.number())).collect();
                if !kinds.contains(&(EntryKind::Cubin, 90))
                    || !kinds.contains(&(EntryKind::Ptx, 80))
                {
                    return Err(format!(
                        "the parser found {labels:?}, not sm_90 ELF and sm_80 PTX"
                    ));
                }
                let want = host_results(runtime, dir, case)?;
                if run_case(gpu, &image, case)? != want {
                    return Err(format!(
                        "entries {labels:?}: the results differ from the host's"
                    ));
                }
                if case.kernel == "args16" {
                    refused(gpu, &image, short, want_refusal)?;
                }
                Ok(format!(
                    "entries {labels:?}; equal to the host{}",
                    if case.kernel == "args16" {
                        ", one argument short refused"
                    } else {
                        ""
                    }
                ))
            });
        }
    }
    let _ = std::fs::remove_dir_all(&work);
}

fn make_fatbin(
    tool: &Path,
    out: &Path,
    cubin: &Path,
    ptx: &Path,
    setting: &str,
) -> Result<(), String> {
    let path = |p: &Path| p.to_str().unwrap_or_default().to_string();
    // CUDA 11+ nvcc passes --image3; older tools know only --image with a profile.
    let forms = [
        vec![
            format!("--image3=kind=elf,sm=90,file={}", path(cubin)),
            format!("--image3=kind=ptx,sm=80,file={}", path(ptx)),
        ],
        vec![
            format!("--image=profile=sm_90,file={}", path(cubin)),
            format!("--image=profile=compute_80,file={}", path(ptx)),
        ],
    ];
    let mut why = String::new();
    for images in forms {
        let mut cmd = std::process::Command::new(tool);
        cmd.arg("-64")
            .arg(format!("--create={}", path(out)))
            .args(&images);
        if !setting.is_empty() {
            cmd.arg(setting);
        }
        match cmd.output() {
            Ok(o) if o.status.success() => return Ok(()),
            Ok(o) => why = String::from_utf8_lossy(&o.stderr).trim().to_string(),
            Err(e) => why = e.to_string(),
        }
    }
    Err(why)
}

/// The CUDA toolkit's stub directory (a `libcuda.so` that is no driver), if the machine has one.
fn stub_dir() -> Option<PathBuf> {
    let mut dirs = vec![
        PathBuf::from("/usr/local/cuda/lib64/stubs"),
        PathBuf::from("/usr/local/cuda/targets/x86_64-linux/lib/stubs"),
    ];
    if let Some(home) = std::env::var_os("CUDA_HOME") {
        dirs.insert(0, PathBuf::from(home).join("lib64/stubs"));
    }
    dirs.into_iter().find(|d| d.join("libcuda.so").is_file())
}

/// `offload info` with the stub directory first on the loader path must still find the GPU
/// (the stub passed over for the real driver), and with the stub named as the driver must say
/// it is the stub.
fn stub_library(offload: &Path, stubs: &Path) -> Result<String, String> {
    let info = |envs: &[(&str, String)]| -> Result<serde_json::Value, String> {
        let mut cmd = std::process::Command::new(offload);
        cmd.args(["info", "--json"]);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let o = cmd
            .output()
            .map_err(|e| format!("{}: {e}", offload.display()))?;
        let json: serde_json::Value = serde_json::from_slice(&o.stdout).map_err(|e| {
            format!(
                "offload info --json: {e}: {}",
                String::from_utf8_lossy(&o.stderr)
            )
        })?;
        json["plugins"]
            .as_array()
            .and_then(|a| a.iter().find(|p| p["name"] == "cuda"))
            .cloned()
            .ok_or_else(|| "no cuda plugin in offload info".to_string())
    };
    let path = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    let first = info(&[("LD_LIBRARY_PATH", format!("{}:{path}", stubs.display()))])?;
    let devices = first["devices"].as_array().map_or(0, Vec::len);
    if devices == 0 {
        return Err(format!(
            "with {} first on the loader path: no device ({})",
            stubs.display(),
            first["reason"]
        ));
    }
    let stub = stubs.join("libcuda.so");
    let named = info(&[("OFFLOAD_CUDA_DRIVER", stub.display().to_string())])?;
    let reason = named["reason"].as_str().unwrap_or_default().to_string();
    if !reason.contains("stub library") {
        return Err(format!(
            "OFFLOAD_CUDA_DRIVER={}: the reason does not name the stub: '{reason}'",
            stub.display()
        ));
    }
    Ok(format!(
        "{devices} device(s) with the stubs first; named as the driver: '{reason}'"
    ))
}

/// The offload side of the launch benchmark: the empty kernel's cubin on `cuda:0`, launched
/// `n` times synchronously, then `n` times on a queue with one wait; per-launch µs of each.
pub fn offload_launch_us(
    runtime: &offload::Runtime,
    cubin: &[u8],
    n: u32,
) -> Result<(f64, f64), String> {
    let gpu = runtime.device("cuda", 0).map_err(|e| e.to_string())?;
    let program = offload_tests::load(&gpu, cubin).map_err(|e| e.to_string())?;
    let kernel = program.kernel("empty").map_err(|e| e.to_string())?;
    let dims = LaunchDims::linear(1, 1);
    let sync = per_call_us(n, || {
        // SAFETY: the buffers are as long as the kernel touches for these arguments.
        unsafe { kernel.launch(dims).unchecked().run() }.unwrap()
    });
    // SAFETY: the device API is used on this test's own allocations only, with no HostBuffer or safe-layer queue on them.
    let raw = unsafe { offload::raw::device(&gpu) };
    let queue = raw.queue_create().map_err(|e| e.to_string())?;
    let queued = per_call_us(1, || {
        for _ in 0..n {
            // SAFETY: the empty kernel takes no argument and touches no memory.
            unsafe { raw.launch(kernel.handle(), &dims, &[], Some(queue)) }.unwrap();
        }
        raw.queue_synchronize(queue).unwrap();
    }) / f64::from(n);
    raw.queue_destroy(queue).map_err(|e| e.to_string())?;
    Ok((sync, queued))
}
