//! The CUDA plugin against a fake driver (`tests/fake-cuda/fake_cuda.c`): a CUDA driver without
//! a GPU that keeps the contracts a plugin can break (a context current on every calling thread,
//! copies inside allocations, frees of live allocations) and logs every launch with the bytes of
//! its parameters. This tests everything of the plugin's device path that does not need the GPU
//! to compute: device properties, image loading for every kind, argument packing, errors with
//! the driver's names and logs, memory, queues and threads.

use offload_tests::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// A fresh log file for one run.
fn log_file(tag: &str) -> PathBuf {
    fake_log("fake-cuda", tag)
}

/// Runs `offload` against the fake driver (plus `envs`).
fn with_fake(args: &[&str], log: &Path, envs: &[(&str, &str)]) -> std::process::Output {
    let lib = fake_cuda_driver();
    let ptxas = ptxas();
    let mut all = vec![
        ("OFFLOAD_CUDA_DRIVER", lib.to_str().unwrap()),
        ("FAKE_CUDA_LOG", log.to_str().unwrap()),
        ("OFFLOAD_PTXAS", ptxas.to_str().unwrap()),
    ];
    all.extend_from_slice(envs);
    offload(args, &all)
}

/// A runtime in this process with only the cuda plugin, on the fake driver logging to `log`,
/// with `envs` set too. The environment is set before anything reads it: nextest runs each
/// test in a process of its own.
fn in_process(log: &Path, envs: &[(&str, &str)]) -> offload::Runtime {
    let driver = fake_cuda_driver();
    let mut all = vec![
        ("OFFLOAD_CUDA_DRIVER", driver.to_str().unwrap()),
        ("FAKE_CUDA_LOG", log.to_str().unwrap()),
    ];
    all.extend_from_slice(envs);
    runtime_with_env("cuda", &all)
}

/// The driver contracts the fake checks: no call without a context or under another device's,
/// no copy outside an allocation, no free of something not allocated, no work that runs after
/// its memory was freed; and everything allocated is freed, every stream destroyed.
fn assert_contracts_kept(lines: &[String], what: &str) {
    for bad in [
        "no-context",
        "wrong-context",
        "bad-free",
        "bad-copy",
        "use-after-free",
    ] {
        let hits: Vec<&String> = lines.iter().filter(|l| l.starts_with(bad)).collect();
        assert!(hits.is_empty(), "{what}: {hits:?}");
    }
    let count = |p: &str| lines.iter().filter(|l| l.starts_with(p)).count();
    assert_eq!(
        count("alloc "),
        count("free "),
        "{what}: every allocation freed once\n{lines:#?}"
    );
    assert_eq!(
        count("stream-create"),
        count("stream-destroy"),
        "{what}: streams"
    );
    assert_eq!(count("load "), count("unload"), "{what}: modules");
}

#[test]
fn info_shows_each_device_with_its_sm_limits_and_memory() {
    let log = log_file("info");
    for (cc, sm) in [
        ("9.0", "sm_90a"),
        ("8.6", "sm_86"),
        ("10.0", "sm_100a"),
        ("7.5", "sm_75"),
    ] {
        let out = with_fake(
            &["info", "--json"],
            &log,
            &[("FAKE_CUDA_CC", cc), ("FAKE_CUDA_DEVICES", "2")],
        );
        assert!(out.status.success(), "{}", stderr(&out));
        let json: Value = serde_json::from_str(&stdout(&out)).unwrap();
        let cuda = plugin_json(&json, "cuda");
        assert_eq!(cuda["status"], "ok", "{cuda}");
        let devices = cuda["devices"].as_array().unwrap();
        assert_eq!(devices.len(), 2);
        for (i, d) in devices.iter().enumerate() {
            assert_eq!(d["name"], format!("Fake CUDA device {i}"));
            assert_eq!(d["compute_unit"], sm, "CC {cc}");
            assert_eq!(d["memory_bytes"], 80u64 << 30);
            assert_eq!(d["compute_units"], 132);
            assert_eq!(d["warp_size"], 32);
            assert_eq!(d["max_threads_per_block"], 1024);
            assert_eq!(d["max_block"], serde_json::json!([1024, 1024, 64]));
            assert_eq!(
                d["max_grid"],
                serde_json::json!([2147483647u32, 65535, 65535])
            );
        }
        assert!(
            cuda["properties"]["driver"]
                .as_str()
                .unwrap()
                .contains("CUDA 12.8"),
            "{cuda}"
        );
        assert!(
            cuda["properties"]["bitcode"]
                .as_str()
                .unwrap()
                .contains("ptxas"),
            "{cuda}"
        );
    }
    let text = stdout(&with_fake(&["info"], &log, &[]));
    assert!(
        text.contains("cuda:0  Fake CUDA device 0 (gpu)  compute unit sm_90a  memory 80.0 GiB")
            && text.contains("132 compute units, warp 32, up to 1024 threads per block"),
        "{text}"
    );
    // Without ptxas, info says the PTX goes to the driver's JIT.
    let out = offload(
        &["info", "--json"],
        &[
            ("OFFLOAD_CUDA_DRIVER", fake_cuda_driver().to_str().unwrap()),
            ("PATH", "/usr/bin:/bin"),
        ],
    );
    let json: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let cuda = plugin_json(&json, "cuda");
    assert!(
        cuda["properties"]["bitcode"]
            .as_str()
            .unwrap()
            .contains("driver's JIT"),
        "{cuda}"
    );
    assert!(
        cuda["properties"]["ptxas"]
            .as_str()
            .unwrap()
            .starts_with("not found"),
        "{cuda}"
    );
}

fn le(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The launch lines of a log, and the device addresses the allocations got, in order.
fn launches_and_allocations(lines: &[String]) -> (Vec<String>, Vec<u64>) {
    let launches = lines
        .iter()
        .filter(|l| l.starts_with("launch "))
        .cloned()
        .collect();
    // Buffers, not the memory of globals (an allocation the driver makes for a `global` line
    // right after it: the runtime reads the kernels' parameter records that way).
    let allocs = lines
        .iter()
        .enumerate()
        .filter(|(i, _)| !lines.get(i + 1).is_some_and(|n| n.starts_with("global ")))
        .filter_map(|(_, l)| l.strip_prefix("alloc 0 0x"))
        .map(|l| u64::from_str_radix(l.split(' ').next().unwrap(), 16).unwrap())
        .collect();
    (launches, allocs)
}

#[test]
fn every_argument_reaches_the_driver_as_the_kernel_declares_it() {
    let ptx_path = scratch("fake-cuda").join("args16.ptx");
    let bc = nvptx_bitcode("args16", "sm_90");
    std::fs::write(
        &ptx_path,
        nvptx_jit(&bc, "sm_90", &["--emit-ptx"], "args16-fake"),
    )
    .unwrap();
    let log = log_file("args16");
    let specs = [
        "i32:-1",
        "i64:-2",
        "f32:3.5",
        "f64:-4.25",
        "i32:5",
        "f32:6",
        "f64:7",
        "i64:8000000000",
        "f32:9",
        "f64:10",
        "i32:11",
        "f64:12",
        "f32:13",
        "i64:14",
        "buf:f64:1000",
        "i32:1000",
    ];
    let mut args = vec![
        "run",
        ptx_path.to_str().unwrap(),
        "--kernel",
        "args16",
        "--device",
        "cuda:0",
    ];
    args.extend(["--grid", "8,2,3", "--block", "128,2"]);
    for s in &specs {
        args.extend(["--arg", s]);
    }
    let out = with_fake(&args, &log, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let lines = log_lines(&log);
    let (launches, allocs) = launches_and_allocations(&lines);
    assert_eq!(launches.len(), 1, "{lines:#?}");
    assert_eq!(allocs.len(), 1);
    let want = [
        le(&(-1i32).to_le_bytes()),
        le(&(-2i64).to_le_bytes()),
        le(&3.5f32.to_le_bytes()),
        le(&(-4.25f64).to_le_bytes()),
        le(&5i32.to_le_bytes()),
        le(&6f32.to_le_bytes()),
        le(&7f64.to_le_bytes()),
        le(&8_000_000_000i64.to_le_bytes()),
        le(&9f32.to_le_bytes()),
        le(&10f64.to_le_bytes()),
        le(&11i32.to_le_bytes()),
        le(&12f64.to_le_bytes()),
        le(&13f32.to_le_bytes()),
        le(&14i64.to_le_bytes()),
        le(&allocs[0].to_le_bytes()),
        le(&1000i32.to_le_bytes()),
    ]
    .join(",");
    assert_eq!(
        launches[0],
        format!("launch args16 grid=8,2,3 block=128,2,1 shared=0 default params={want}")
    );
    assert_contracts_kept(&lines, "args16");
}

#[test]
fn wrong_arguments_are_refused_before_the_driver_sees_them() {
    // PTX and a cubin, with a driver that says each parameter's size and with one too old to
    // (FAKE_CUDA_NO_PARAM_INFO: the sizes then come from the PTX `.entry` and the cubin's
    // `.nv.info` records).
    let dir = scratch("fake-cuda");
    let bc = nvptx_bitcode("saxpy", "sm_90");
    let ptx = nvptx_jit(&bc, "sm_90", &["--emit-ptx"], "saxpy-fake");
    let ptx_path = dir.join("saxpy.ptx");
    std::fs::write(&ptx_path, &ptx).unwrap();
    let cubin_path = dir.join("saxpy-wrong.cubin");
    std::fs::write(&cubin_path, ptxas_cubin(&ptx, "sm_90", "saxpy-wrong")).unwrap();
    let cases: [(&[&str], &str); 3] = [
        (
            &["i32:4", "f32:2", "buf:f32:4"],
            "takes 4 argument(s) (of 4, 4, 8, 8 bytes); the launch passes 3",
        ),
        (
            &["i64:4", "f32:2", "buf:f32:4", "buf:f32:4"],
            "argument 0 is 4 bytes in the kernel; the launch passes i64 (8 bytes)",
        ),
        (
            &["i32:4", "f64:2", "buf:f32:4", "buf:f32:4"],
            "argument 1 is 4 bytes in the kernel; the launch passes f64 (8 bytes)",
        ),
    ];
    for image in [&ptx_path, &cubin_path] {
        let p = image.to_str().unwrap();
        for old_driver in [false, true] {
            let envs: &[(&str, &str)] = if old_driver {
                &[("FAKE_CUDA_NO_PARAM_INFO", "1")]
            } else {
                &[]
            };
            for (i, (specs, want)) in cases.iter().enumerate() {
                let what = format!("{p}, old driver {old_driver}, case {i}");
                let log = log_file(&format!("wrong-{i}"));
                let mut args = vec!["run", p, "--kernel", "saxpy", "--device", "cuda:0"];
                for s in specs.iter() {
                    args.extend(["--arg", s]);
                }
                let out = with_fake(&args, &log, envs);
                let err = stderr(&out);
                assert_eq!(out.status.code(), Some(1), "{what}: {err}");
                assert!(
                    err.contains(want) && err.contains("kernel 'saxpy'"),
                    "{what}: {err}"
                );
                let lines = log_lines(&log);
                assert!(
                    !lines.iter().any(|l| l.starts_with("launch")),
                    "{what}: {lines:#?}"
                );
                assert_contracts_kept(&lines, want);
            }
        }
    }
    // A kernel whose parameters neither the driver nor this reader of its PTX can tell: no
    // launch, rather than a driver reading past the arguments.
    let odd = dir.join("odd.ptx");
    std::fs::write(
        &odd,
        ".version 8.0\n.target sm_90\n.address_size 64\n\
         .visible .entry odd(.param .u32 n, .param .texref t)\n{\n ret;\n}\n",
    )
    .unwrap();
    let log = log_file("odd");
    let out = with_fake(
        &[
            "run",
            odd.to_str().unwrap(),
            "--kernel",
            "odd",
            "--arg",
            "i32:1",
        ],
        &log,
        &[("FAKE_CUDA_NO_PARAM_INFO", "1")],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("cannot be launched safely"), "{err}");
    assert!(!log_lines(&log).iter().any(|l| l.starts_with("launch")));
}

#[test]
fn every_image_kind_loads_and_launches_through_the_driver() {
    use offload_cuda::fatbin::{EntryKind, build};
    let dir = scratch("fake-cuda-kinds");
    let bc = nvptx_bitcode("saxpy", "sm_80");
    let ptx = nvptx_jit(&bc, "sm_80", &["--emit-ptx"], "kinds-ptx");
    let cubin = ptxas_cubin(&ptx, "sm_90", "kinds");
    let cubin80 = ptxas_cubin(&ptx, "sm_80", "kinds");
    let fat_cubin = build(&[(EntryKind::Ptx, 80, &ptx), (EntryKind::Cubin, 90, &cubin)]);
    let fat_ptx = build(&[(EntryKind::Cubin, 80, &cubin80), (EntryKind::Ptx, 80, &ptx)]);
    // (file, bytes, what the driver must be given, parameter bytes logged)
    let cases: [(&str, &[u8], &str); 5] = [
        ("saxpy.cubin", &cubin, "load binary"),
        ("saxpy.ptx", &ptx, "load ptx"),
        ("saxpy-cubin.fatbin", &fat_cubin, "load binary"),
        ("saxpy-ptx.fatbin", &fat_ptx, "load ptx"),
        ("saxpy.bc", &std::fs::read(&bc).unwrap(), "load binary"),
    ];
    for ((name, bytes, load), old_driver) in cases.into_iter().flat_map(|c| [(c, false), (c, true)])
    {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        let log = log_file(name);
        let envs: &[(&str, &str)] = if old_driver {
            &[("FAKE_CUDA_NO_PARAM_INFO", "1")]
        } else {
            &[]
        };
        let args = [
            "run",
            path.to_str().unwrap(),
            "--kernel",
            "saxpy",
            "--json",
            "--grid",
            "4",
            "--block",
            "256",
            "--arg",
            "i32:1000",
            "--arg",
            "f32:2",
            "--arg",
            "buf:f32:1000:iota",
            "--arg",
            "buf:f32:1000:fill=1",
        ];
        let out = with_fake(&args, &log, envs);
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        let json: Value = serde_json::from_str(&stdout(&out)).unwrap();
        assert_eq!(json["device"], "cuda:0", "{name}: routed by the image");
        // The kernel did not run (the fake only logs), so y comes back as it went in: the
        // copies in both directions are real.
        assert_eq!(json["buffers"][1]["head"][0], 1.0, "{name}: {json}");
        assert_eq!(json["buffers"][0]["head"][3], 3.0, "{name}: {json}");
        let lines = log_lines(&log);
        assert!(
            lines
                .iter()
                .any(|l| l == load || l.starts_with(&format!("{load} "))),
            "{name}: {lines:#?}"
        );
        let (launches, allocs) = launches_and_allocations(&lines);
        assert_eq!(launches.len(), 1, "{name}: {lines:#?}");
        let prefix = "launch saxpy grid=4,1,1 block=256,1,1 shared=0 default params=";
        assert!(launches[0].starts_with(prefix), "{name}: {}", launches[0]);
        {
            // The fake knows every kernel's parameters, as a driver does (PTX's `.entry`, a
            // cubin's `.nv.info`), so it logs their bytes.
            let want = [
                le(&1000i32.to_le_bytes()),
                le(&2f32.to_le_bytes()),
                le(&allocs[0].to_le_bytes()),
                le(&allocs[1].to_le_bytes()),
            ];
            assert_eq!(&launches[0][prefix.len()..], want.join(","), "{name}");
        }
        if name.ends_with(".bc") {
            assert_eq!(json["jit"]["compiles"], 1, "{json}");
            assert!(
                json["jit"]["post_process"]
                    .as_str()
                    .unwrap()
                    .contains("ptxas"),
                "{json}"
            );
        }
        assert_contracts_kept(&lines, name);
    }
}

#[test]
fn images_the_device_cannot_run_are_refused_naming_both_architectures() {
    let dir = scratch("fake-cuda-mismatch");
    let bc = nvptx_bitcode("saxpy", "sm_90");
    let cubin = dir.join("saxpy.cubin");
    std::fs::write(&cubin, nvptx_jit(&bc, "sm_90", &[], "mismatch-cubin")).unwrap();
    let ptx = dir.join("saxpy.ptx");
    std::fs::write(
        &ptx,
        nvptx_jit(&bc, "sm_90", &["--emit-ptx"], "mismatch-ptx"),
    )
    .unwrap();
    for (image, cc, want) in [
        (
            &cubin,
            "8.0",
            "the cubin is for sm_90, this device is sm_80",
        ),
        (
            &cubin,
            "10.0",
            "the cubin is for sm_90, this device is sm_100a",
        ),
        (&ptx, "8.6", "the PTX targets sm_90, this device is sm_86"),
    ] {
        let log = log_file("mismatch");
        let out = with_fake(
            &["run", image.to_str().unwrap(), "--kernel", "saxpy"],
            &log,
            &[("FAKE_CUDA_CC", cc)],
        );
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains(want), "{err}");
        assert!(
            !log_lines(&log).iter().any(|l| l.starts_with("load")),
            "never handed to the driver"
        );
    }
    // Bitcode for sm_90 is compiled for an sm_100 device at the newest SM LLVM knows, and
    // assembled by ptxas for the device itself.
    let log = log_file("newer");
    let out = with_fake(
        &[
            "run",
            bc.to_str().unwrap(),
            "--kernel",
            "saxpy",
            "--arg",
            "i32:0",
            "--arg",
            "f32:0",
            "--arg",
            "buf:f32:1",
            "--arg",
            "buf:f32:1",
        ],
        &log,
        &[("FAKE_CUDA_CC", "10.0")],
    );
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn driver_errors_name_the_call_the_cuda_error_and_the_compiler_log() {
    let dir = scratch("fake-cuda-errors");
    let bc = nvptx_bitcode("saxpy", "sm_90");
    let ptx = nvptx_jit(&bc, "sm_90", &["--emit-ptx"], "errors-ptx");
    let mut text = String::from_utf8(ptx).unwrap();
    text.push_str("\n// bogus_instruction\n");
    let bad = dir.join("bad.ptx");
    std::fs::write(&bad, text).unwrap();
    let log = log_file("errors");
    let out = with_fake(
        &["run", bad.to_str().unwrap(), "--kernel", "saxpy"],
        &log,
        &[],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    for want in [
        "cuModuleLoadDataEx",
        "CUDA_ERROR_INVALID_PTX",
        "the driver's PTX compiler said: ptxas application ptx input, line 9; error   : Unknown instruction 'bogus_instruction' | ptxas fatal",
        "bad.ptx",
    ] {
        assert!(err.contains(want), "'{want}' missing from: {err}");
    }
    // Out of device memory: the call and the CUDA error name.
    let good = dir.join("good.ptx");
    std::fs::write(
        &good,
        nvptx_jit(&bc, "sm_90", &["--emit-ptx"], "errors-good"),
    )
    .unwrap();
    let out = with_fake(
        &[
            "run",
            good.to_str().unwrap(),
            "--kernel",
            "saxpy",
            "--arg",
            "i32:1",
            "--arg",
            "f32:1",
            "--arg",
            "buf:f32:1000",
            "--arg",
            "buf:f32:1000",
        ],
        &log,
        &[("FAKE_CUDA_MEMORY", "6000")],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("cuMemAlloc_v2") && err.contains("CUDA_ERROR_OUT_OF_MEMORY"),
        "{err}"
    );
    // A kernel the module does not have.
    let out = with_fake(
        &["run", good.to_str().unwrap(), "--kernel", "nope"],
        &log,
        &[],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("kernel 'nope'") && err.contains("CUDA_ERROR_NOT_FOUND"),
        "{err}"
    );
    assert_contracts_kept(&log_lines(&log), "errors");
}

/// In this process: queues, events and threads. Every thread that calls in, and every queue's
/// own thread, must have the context current (the fake refuses calls otherwise); memory is
/// freed once, after the work using it; more than 48 KiB of dynamic shared memory is opted into.
#[test]
fn queues_threads_and_shared_memory_keep_the_driver_contracts() {
    use offload::{KernelArg, LaunchDims, MemoryKind};
    let log = log_file("in-process");
    let rt = in_process(&log, &[("OFFLOAD_PTXAS", ptxas().to_str().unwrap())]);
    let device = rt.device("cuda", 0).unwrap();
    let bc = nvptx_bitcode("saxpy", "sm_90");
    let ptx = nvptx_jit(&bc, "sm_90", &["--emit-ptx"], "in-process");
    let program = offload_tests::load(&device, &ptx).unwrap();
    let owned_kernel = program.kernel("saxpy").unwrap();
    let kernel = &owned_kernel;
    // SAFETY: the device API is used on this test's own allocations only, with no HostBuffer or safe-layer queue on them.
    let raw = unsafe { offload::raw::device(&device) }.clone();
    let n = 4096usize;
    std::thread::scope(|s| {
        for t in 0..4 {
            let raw = raw.clone();
            s.spawn(move || {
                let x = raw.alloc((n * 4) as u64, MemoryKind::Device).unwrap();
                let y = raw.alloc((n * 4) as u64, MemoryKind::Device).unwrap();
                let queue = raw.queue_create().unwrap();
                let host: Vec<u8> = (0..n * 4).map(|i| (i * (t + 1)) as u8).collect();
                let mut back = vec![0u8; n * 4];
                // SAFETY: `host` and `back` outlive the queue synchronisation below.
                unsafe {
                    raw.copy_to_device(x, host.as_ptr(), host.len(), Some(queue))
                        .unwrap();
                }
                let dims = LaunchDims {
                    grid: [16, 1, 1],
                    block: [256, 1, 1],
                    shared_mem_bytes: if t == 0 { 64 << 10 } else { 0 },
                };
                let args = [
                    KernelArg::I32(n as i32),
                    KernelArg::F32(2.0),
                    KernelArg::Ptr(x),
                    KernelArg::Ptr(y),
                ];
                // SAFETY: a test kernel on this test's own allocations, each as long as the kernel touches.
                unsafe { raw.launch(kernel.handle(), &dims, &args, Some(queue)) }.unwrap();
                // SAFETY: as above.
                unsafe { raw.copy_device_to_device(y, x, (n * 4) as u64, Some(queue)) }.unwrap();
                let event = raw.event_create().unwrap();
                raw.event_record(event, queue).unwrap();
                // SAFETY: as above.
                unsafe {
                    raw.copy_from_device(back.as_mut_ptr(), y, back.len(), Some(queue))
                        .unwrap();
                }
                // Freed while the queue may still use them: the layer frees after the work.
                // SAFETY: nothing of this test uses them after; queued work keeps them alive.
                unsafe { raw.free(x).and_then(|()| raw.free(y)) }.unwrap();
                raw.event_synchronize(event).unwrap();
                raw.queue_synchronize(queue).unwrap();
                assert_eq!(
                    back, host,
                    "thread {t}: x went to the device, to y, and back"
                );
                raw.event_destroy(event).unwrap();
                raw.queue_destroy(queue).unwrap();
            });
        }
    });
    // The kernel keeps its program loaded: both go, and the module is unloaded.
    drop(owned_kernel);
    drop(program);
    let lines = log_lines(&log);
    let launches = lines
        .iter()
        .filter(|l| l.starts_with("launch saxpy"))
        .count();
    assert_eq!(launches, 4, "{lines:#?}");
    // Raised once, to the device's opt-in limit (the fake's 227 KiB, less no static memory).
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.starts_with("attribute saxpy 8 "))
            .collect::<Vec<_>>(),
        ["attribute saxpy 8 232448"],
        "{lines:#?}"
    );
    assert!(
        lines.iter().any(|l| l.contains("shared=65536 stream")),
        "{lines:#?}"
    );
    assert_contracts_kept(&lines, "threads and queues");
}

#[test]
fn binaries_reach_the_driver_8_byte_aligned_wherever_the_caller_s_bytes_lie() {
    // An image in a caller's buffer (or a container entry) may start at any address; cubins
    // and fat binaries go to the driver from an aligned copy (the fake refuses others).
    use offload_cuda::fatbin::{self, EntryKind};
    let log = log_file("aligned");
    let rt = in_process(&log, &[]);
    let device = rt.device("cuda", 0).unwrap();
    let ptx = nvptx_jit(
        &nvptx_bitcode("saxpy", "sm_90"),
        "sm_90",
        &["--emit-ptx"],
        "aligned",
    );
    let cubin = ptxas_cubin(&ptx, "sm_90", "aligned");
    let fat = fatbin::build(&[(EntryKind::Cubin, 90, &cubin)]);
    for image in [&cubin, &fat] {
        for shift in 1..8 {
            let mut buffer = vec![0u8; image.len() + 8];
            let at = (8 - buffer.as_ptr() as usize % 8) % 8 + shift;
            buffer[at..at + image.len()].copy_from_slice(image);
            let bytes = &buffer[at..at + image.len()];
            assert_ne!(bytes.as_ptr() as usize % 8, 0);
            let program = offload_tests::load(&device, bytes).unwrap();
            program.kernel("saxpy").unwrap();
        }
    }
    let lines = log_lines(&log);
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.starts_with("load binary"))
            .count(),
        14,
        "{lines:#?}"
    );
    assert!(!lines.iter().any(|l| l.starts_with("unaligned-image")));
}

#[test]
fn a_compressed_entry_of_a_later_fat_binary_reaches_the_driver_in_its_own() {
    // cuModuleLoadFatBinary reads the first fat binary it is given (the fake too). Of two
    // concatenated, the entry chosen for an sm_90 device is in the second: that one is what
    // the driver must get, or it looks in the wrong one.
    use offload_cuda::fatbin::{self, EntryKind};
    let log = log_file("concatenated");
    let rt = in_process(&log, &[]);
    let device = rt.device("cuda", 0).unwrap();
    let mut image = fatbin::build(&[(EntryKind::Cubin, 100, b"\x01\x02compressed other\0")]);
    image.extend(fatbin::build(&[(
        EntryKind::Cubin,
        90,
        b"\x01\x02compressed saxpy\0",
    )]));
    let program = offload_tests::load(&device, &image).unwrap();
    program.kernel("saxpy").unwrap();
    let lines = log_lines(&log);
    let loads: Vec<&String> = lines.iter().filter(|l| l.starts_with("load ")).collect();
    assert_eq!(
        loads,
        [&format!("load binary {}", image.len() / 2)],
        "{lines:#?}"
    );
}

#[test]
fn queued_work_runs_back_to_back_and_keeps_its_memory_until_it_has_run() {
    // Queued operations are only put on the stream (no wait after each); what they use stays
    // alive, and synchronous operations and events wait, until the stream has run them. The
    // fake runs each operation 3 ms after the one before, so anything released or read early
    // shows: a read of the old value, a "use-after-free".
    use offload::LaunchDims;
    let log = log_file("back-to-back");
    let rt = in_process(&log, &[("FAKE_CUDA_DELAY_US", "3000")]);
    let device = rt.device("cuda", 0).unwrap();
    let add_k = nvptx_jit(
        &nvptx_bitcode("add_k", "sm_90"),
        "sm_90",
        &["--emit-ptx"],
        "back-to-back",
    );
    let program = offload_tests::load(&device, &add_k).unwrap();
    let add = program.kernel("add_k").unwrap();
    let n = 1000usize;
    let dims = LaunchDims::for_elems(n as u64, 128).unwrap();
    let queue = device.queue().unwrap();
    let mut x = device.alloc::<u32>(n).unwrap();
    x.fill(1).unwrap();
    for _ in 0..5 {
        add.launch(dims)
            .arg(n as i32)
            .arg(2u32)
            .arg(&mut x)
            .on(&queue)
            .run()
            .unwrap();
    }
    let after = queue.record().unwrap();
    // A synchronous read waits for the queued launches that write the buffer.
    assert!(x.to_vec().unwrap().iter().all(|v| *v == 11));
    after.synchronize().unwrap();
    assert!(after.is_complete().unwrap());
    // Memory dropped while a queued launch uses it is freed after the launch has run.
    let mut y = device.alloc::<u32>(n).unwrap();
    y.fill(0).unwrap();
    add.launch(dims)
        .arg(n as i32)
        .arg(7u32)
        .arg(&mut y)
        .on(&queue)
        .run()
        .unwrap();
    drop(y);
    queue.synchronize().unwrap();
    drop(x);
    drop(queue);
    drop(add);
    drop(program);
    drop(rt);
    let lines = log_lines(&log);
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.starts_with("launch add_k"))
            .count(),
        6,
        "{lines:#?}"
    );
    // One stream synchronize for the 5 back-to-back launches, not one each.
    let syncs = lines
        .iter()
        .filter(|l| l.starts_with("stream-synchronize stream"))
        .count();
    assert!(syncs <= 3, "{syncs} stream synchronizes: {lines:#?}");
    assert_contracts_kept(&lines, "back to back");
}

#[test]
fn the_parameter_record_of_a_ptx_kernel_checks_launches_through_the_driver() {
    use offload::LaunchDims;
    let log = log_file("params");
    let rt = in_process(&log, &[("OFFLOAD_PTXAS", ptxas().to_str().unwrap())]);
    let device = rt.device("cuda", 0).unwrap();
    // kernels/saxpy.c's OFFLOAD_PARAMS, through the JIT to PTX: the record is a `.global`
    // the runtime reads with cuModuleGetGlobal and cuMemcpyDtoH, as on a real GPU.
    let bc = nvptx_bitcode("saxpy", "sm_90");
    let ptx = nvptx_jit(&bc, "sm_90", &["--emit-ptx"], "params");
    assert!(
        String::from_utf8_lossy(&ptx).contains("__offload_params_saxpy"),
        "the record is in the PTX"
    );
    let program = offload_tests::load(&device, &ptx).unwrap();
    let saxpy = program.kernel("saxpy").unwrap();
    let params = saxpy.params().unwrap().unwrap();
    assert_eq!(params.text, "int n, float a, const float x[n], float y[n]");
    let x = device.upload(&[1.0f32; 16]).unwrap();
    let mut y = device.upload(&[1.0f32; 16]).unwrap();
    let e = saxpy
        .launch(LaunchDims::for_elems(256, 256).unwrap())
        .arg(256i32)
        .arg(2.0f32)
        .arg(&x)
        .arg(&mut y)
        .run()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("may touch 256 element(s)") && e.contains("holds 16"),
        "{e}"
    );
    saxpy
        .launch(LaunchDims::for_elems(16, 256).unwrap())
        .arg(16i32)
        .arg(2.0f32)
        .arg(&x)
        .arg(&mut y)
        .run()
        .unwrap();
    drop((saxpy, program, x, y));
    let lines = log_lines(&log);
    assert_eq!(
        lines.iter().filter(|l| l.starts_with("launch")).count(),
        1,
        "only the checked launch reached the driver: {lines:#?}"
    );
    assert_contracts_kept(&lines, "params");
}

#[test]
fn overlapping_device_copies_reach_the_driver_as_disjoint_ones() {
    // The fake's copy engine gets overlapping copies wrong, as a real one may: memmove's
    // result here means the layer split or staged every overlapping copy.
    let log = log_file("overlap");
    let rt = in_process(&log, &[]);
    let device = rt.device("cuda", 0).unwrap();
    check_overlapping_device_copies(&device, 0xc0_9e12, 400);
    let lines = log_lines(&log);
    let overlapping: Vec<&String> = lines
        .iter()
        .filter(|l| l.starts_with("overlapping-copy"))
        .collect();
    assert!(overlapping.is_empty(), "{overlapping:?}");
    assert!(
        lines.iter().filter(|l| l.starts_with("copy dtod")).count() > 400,
        "pieces and staged copies"
    );
    assert_contracts_kept(&lines, "overlapping copies");
}

#[test]
fn kernels_on_two_queues_that_share_a_buffer_run_at_the_same_time() {
    // Two launches of a kernel that waits until both are running (as producer/consumer
    // kernels wait for each other through memory), on two queues, with the same buffer: a
    // layer that held the buffer's lock across the GPU's work would let only one run.
    use offload::{KernelArg, LaunchDims, MemoryKind};
    let log = log_file("rendezvous");
    let rt = in_process(&log, &[]);
    let device = rt.device("cuda", 0).unwrap();
    let ptx = ".version 8.0\n.target sm_90\n.address_size 64\n\
               .visible .entry rendezvous(.param .u64 flags)\n{\n ret;\n}\n";
    let program = offload_tests::load(&device, ptx.as_bytes()).unwrap();
    let kernel = program.kernel("rendezvous").unwrap();
    // SAFETY: the device API on this test's own allocation only.
    let raw = unsafe { offload::raw::device(&device) }.clone();
    let flags = raw.alloc(64, MemoryKind::Device).unwrap();
    let queues = [raw.queue_create().unwrap(), raw.queue_create().unwrap()];
    for q in queues {
        // SAFETY: a test kernel on this test's own allocations, each as long as the kernel touches.
        unsafe {
            raw.launch(
                kernel.handle(),
                &LaunchDims::linear(1, 32),
                &[KernelArg::Ptr(flags)],
                Some(q),
            )
        }
        .unwrap();
    }
    for q in queues {
        raw.queue_synchronize(q).unwrap();
        raw.queue_destroy(q).unwrap();
    }
    // SAFETY: the test's own allocation, which its queues no longer use.
    unsafe { raw.free(flags) }.unwrap();
    drop((kernel, program));
    let lines = log_lines(&log);
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.starts_with("launch rendezvous"))
            .count(),
        2,
        "{lines:#?}"
    );
    assert!(
        !lines.iter().any(|l| l == "rendezvous-timeout"),
        "the two launches did not run at the same time: {lines:#?}"
    );
    assert_contracts_kept(&lines, "rendezvous");
}

/// `offload run` of saxpy (PTX) on the fake with `envs`, block `block`, `shared` bytes of
/// dynamic shared memory: the exit code, stderr and the driver's log.
fn run_saxpy(
    tag: &str,
    block: &str,
    shared: &str,
    envs: &[(&str, &str)],
) -> (i32, String, Vec<String>) {
    let ptx_path = scratch("fake-cuda").join("saxpy-limits.ptx");
    if !ptx_path.exists() {
        let bc = nvptx_bitcode("saxpy", "sm_90");
        std::fs::write(
            &ptx_path,
            nvptx_jit(&bc, "sm_90", &["--emit-ptx"], "saxpy-limits"),
        )
        .unwrap();
    }
    let log = log_file(tag);
    let out = with_fake(
        &[
            "run",
            ptx_path.to_str().unwrap(),
            "--kernel",
            "saxpy",
            "--block",
            block,
            "--shared-mem",
            shared,
            "--arg",
            "i32:64",
            "--arg",
            "f32:2",
            "--arg",
            "buf:f32:64",
            "--arg",
            "buf:f32:64",
        ],
        &log,
        envs,
    );
    (
        out.status.code().unwrap_or(-1),
        stderr(&out),
        log_lines(&log),
    )
}

#[test]
fn the_kernel_s_own_thread_and_shared_memory_limits_are_checked_with_their_numbers() {
    // A kernel whose registers allow 256 threads per block: 512 is refused before the
    // driver, naming both numbers (the driver would fail it with 701).
    let limits = [("FAKE_CUDA_KERNEL_LIMITS", "saxpy:256:32768")];
    let (code, err, lines) = run_saxpy("threads", "512", "0", &limits);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("kernel 'saxpy' runs at most 256 threads per block (CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK")
            && err.contains("512x1x1 = 512"),
        "{err}"
    );
    assert!(!lines.iter().any(|l| l.starts_with("launch")), "{lines:#?}");
    let (code, err, _) = run_saxpy("threads-ok", "256", "0", &limits);
    assert_eq!(code, 0, "{err}");
    // 32 KiB static + 40 KiB dynamic: over the 48 KiB default, within the opt-in limit. The
    // plugin raises the kernel's attribute (a threshold on the dynamic size alone would not,
    // and the driver would refuse the launch).
    let (code, err, lines) = run_saxpy("static-plus-dynamic", "256", "40960", &limits);
    assert_eq!(code, 0, "{err}\n{lines:#?}");
    assert!(
        lines
            .iter()
            .any(|l| l == &format!("attribute saxpy 8 {}", 232448 - 32768)),
        "{lines:#?}"
    );
    assert!(
        lines.iter().any(|l| l.contains("shared=40960")),
        "{lines:#?}"
    );
    // Over the opt-in limit: refused with the sum and the limit.
    let (code, err, lines) = run_saxpy("too-much", "256", "204800", &limits);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("32768 bytes of static shared memory")
            && err.contains("237568")
            && err.contains("at most 232448"),
        "{err}"
    );
    assert!(!lines.iter().any(|l| l.starts_with("launch")), "{lines:#?}");
}

#[test]
fn sticky_and_non_sticky_launch_failures_are_told_apart() {
    // 701 (out of resources) fails that launch only; its message says what to change, not
    // to restart.
    let (code, err, _) = run_saxpy("oor", "64", "0", &[("FAKE_CUDA_FAULT", "saxpy:701")]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES")
            && err.contains("launch smaller blocks")
            && !err.contains("restart"),
        "{err}"
    );
    // 700 (illegal address) comes with the next synchronisation and poisons the context.
    let (code, err, lines) = run_saxpy("fault", "64", "0", &[("FAKE_CUDA_FAULT", "saxpy:700")]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("CUDA_ERROR_ILLEGAL_ADDRESS") && err.contains("restart the process"),
        "{err}"
    );
    assert!(lines.iter().any(|l| l == "fault saxpy 700"), "{lines:#?}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
}

#[test]
fn after_a_non_sticky_failure_the_device_still_works() {
    use offload::LaunchDims;
    let log = log_file("after-701");
    let rt = in_process(&log, &[("FAKE_CUDA_FAULT", "bad:701")]);
    let device = rt.device("cuda", 0).unwrap();
    let ptx = ".version 8.0\n.target sm_90\n.address_size 64\n\
               .visible .entry bad(.param .u32 n)\n{\n ret;\n}\n\
               .visible .entry good(.param .u32 n)\n{\n ret;\n}\n";
    let program = offload_tests::load(&device, ptx.as_bytes()).unwrap();
    for (name, ok) in [
        ("bad", false),
        ("good", true),
        ("bad", false),
        ("good", true),
    ] {
        let k = program.kernel(name).unwrap();
        // SAFETY: the kernels take one int and touch no memory.
        let r = unsafe {
            k.launch(LaunchDims::linear(1, 32))
                .arg(1i32)
                .unchecked()
                .run()
        };
        assert_eq!(r.is_ok(), ok, "{name}: {r:?}");
        let x = device.upload(&[1u32, 2, 3]).unwrap();
        assert_eq!(x.to_vec().unwrap(), [1, 2, 3], "copies work after {name}");
    }
}

#[test]
fn random_queued_work_on_several_threads_and_devices_matches_the_model() {
    // The fake runs add_k, later, on each stream's thread: a missing wait, a copy out of
    // order or memory freed under queued work shows as a wrong read. Two devices at once,
    // each used from several threads: the fake refuses (and logs) any call made under the
    // other device's context.
    let log = log_file("random-queued");
    let rt = in_process(&log, &[("FAKE_CUDA_DEVICES", "2")]);
    let ptx = nvptx_jit(
        &nvptx_bitcode("add_k", "sm_90"),
        "sm_90",
        &["--emit-ptx"],
        "add_k",
    );
    std::thread::scope(|s| {
        for d in 0..2 {
            let (rt, ptx) = (&rt, &ptx);
            s.spawn(move || {
                let device = rt.device("cuda", d).unwrap();
                let program = offload_tests::load(&device, ptx).unwrap();
                let add = program.kernel("add_k").unwrap();
                check_random_queued_work(&device, &add, 0xc0da + d as u64);
            });
        }
    });
    let lines = log_lines(&log);
    assert!(
        lines
            .iter()
            .filter(|l| l.starts_with("launch add_k"))
            .count()
            > 100
    );
    for bad in ["wrong-context", "use-after-free", "fault"] {
        let hits: Vec<&String> = lines.iter().filter(|l| l.starts_with(bad)).collect();
        assert!(hits.is_empty(), "{hits:?}");
    }
    assert_contracts_kept(&lines, "random queued work");
}

#[test]
fn the_gpu_check_runs_end_to_end_against_the_fake_driver() {
    // The script and the check binary as they will run on a GPU machine, with the fake
    // driver: every step runs; only kernels the fake does not compute go uncompared. With
    // failing allocations the check fails, and its status survives the pipe.
    let mut wants = vec![
        "saxpy from cubin sm_90a",
        "saxpy from bitcode sm_80 (JIT for sm_90a)",
        "a register-heavy kernel: 1024 threads refused, its own limit runs",
        "a launch one argument short refused (cubin, PTX)",
        "dynamic shared memory from 2 threads: 64 KiB and 100 KiB launches",
        "launch overhead, empty kernel, against raw cudarc",
    ];
    wants.extend(GPU_CHECK_EXTRAS);
    let run = assert_gpu_check_dry_run("cuda", &wants, Some(("FAKE_CUDA_MEMORY", "4096")));
    // LLVM's suite, recorded and replayed (two tests in the dry run, one nvptx64 JIT build).
    assert_eq!(assert_suite_replayed(&run.log, 2), 1);
}

#[test]
fn pointers_from_outside_the_plugin_reach_the_driver() {
    // Memory another runtime of the process allocated (cudaMalloc) is not the plugin's to
    // know: the GPU takes the pointer (a stray one faults there, not here).
    use offload::{KernelArg, LaunchDims};
    let log = log_file("foreign-pointer");
    let rt = in_process(&log, &[]);
    let device = rt.device("cuda", 0).unwrap();
    let ptx = ".version 8.0\n.target sm_90\n.address_size 64\n\
               .visible .entry touch(.param .u64 p)\n{\n ret;\n}\n";
    let program = offload_tests::load(&device, ptx.as_bytes()).unwrap();
    let k = program.kernel("touch").unwrap();
    let foreign = 0x7f00_dead_0000u64;
    // SAFETY: `touch` does nothing with its pointer.
    unsafe {
        k.launch(LaunchDims::linear(1, 32))
            .args_raw(&[KernelArg::Ptr(offload::DevicePtr(foreign))])
            .unchecked()
            .run()
    }
    .unwrap();
    let lines = log_lines(&log);
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("launch touch") && l.ends_with(&le(&foreign.to_le_bytes()))),
        "{lines:#?}"
    );
}

#[test]
fn a_copy_to_pinned_host_memory_whose_wait_gives_up_cannot_write_it() {
    // The driver copies to pinned memory (a HostBuffer the program has as a slice)
    // asynchronously: the copy goes through a staging buffer, so a synchronize that gives up
    // leaves the engine only the staging buffer to write.
    hung_copy_to_the_host("pinned-copy-hangs", HungRead::Pinned);
}

#[test]
fn a_queued_copy_to_pinned_host_memory_whose_wait_gives_up_cannot_write_it_either() {
    hung_copy_to_the_host("queued-pinned-copy-hangs", HungRead::PinnedQueued);
}

#[test]
fn a_copy_to_pageable_memory_is_not_staged() {
    // The driver completes a copy to pageable memory before the call returns, so the plugin
    // copies there directly; a copy to a HostBuffer goes through a staging buffer.
    let log = log_file("pageable-direct");
    let rt = in_process(&log, &[]);
    let device = rt.device("cuda", 0).unwrap();
    let v: Vec<u32> = (0..1000).collect();
    let dbuf = device.upload(&v).unwrap();
    let mut back = vec![0u32; 1000];
    dbuf.read(&mut back).unwrap();
    assert_eq!(back, v);
    let mut pinned = device.alloc_host::<u32>(1000).unwrap();
    dbuf.read(pinned.as_mut_slice().unwrap()).unwrap();
    assert_eq!(pinned.as_slice().unwrap(), &v[..]);
    drop((pinned, dbuf, device, rt));
    let lines = log_lines(&log);
    let copies: Vec<&String> = lines
        .iter()
        .filter(|l| l.starts_with("copy dtoh"))
        .collect();
    // The pageable read, the staged read, and as_slice's look at one element (staged).
    assert_eq!(copies.len(), 4, "{lines:#?}");
}

/// A read to pinned memory whose copy hangs and whose synchronize gives up
/// (FAKE_CUDA_COPY_HANGS), [`hung_read`].
fn hung_copy_to_the_host(tag: &str, how: HungRead) {
    let log = log_file(tag);
    let rt = in_process(&log, &[("FAKE_CUDA_COPY_HANGS", "4000")]);
    let device = rt.device("cuda", 0).unwrap();
    hung_read(
        &device,
        &fake_cuda_driver(),
        "fake_cuda_finish_held_copies",
        how,
        &log,
    );
    let lines = log_lines(&log);
    assert!(
        lines.iter().any(|l| l == "stream-synchronize-gives-up 46"),
        "{lines:#?}"
    );
}

/// An add_k launch, queued or not, on the fake driver that `env` makes fail ([`fail_a_launch`]),
/// and the driver's log.
fn add_k_failure(tag: &str, env: (&str, &str), queued: bool) -> (LaunchFailure, Vec<String>) {
    let log = log_file(tag);
    let rt = in_process(&log, &[env, ("FAKE_CUDA_DELAY_US", "20000")]);
    let device = rt.device("cuda", 0).unwrap();
    let image = nvptx_jit(
        &nvptx_bitcode("add_k", "sm_90"),
        "sm_90",
        &["--emit-ptx"],
        tag,
    );
    let program = offload_tests::load(&device, &image).unwrap();
    let add = program.kernel("add_k").unwrap();
    let failure = fail_a_launch(&device, &add, queued);
    drop((add, program, device, rt));
    (failure, log_lines(&log))
}

#[test]
fn a_synchronize_that_gives_up_quarantines_the_memory_of_the_work_and_fails_the_device() {
    // The synchronize after the launch returns a non-sticky status without waiting: the work
    // still runs 20 ms later, so its buffer must never be freed, and the device takes no more.
    let (failure, lines) = add_k_failure(
        "sync-gives-up",
        ("FAKE_CUDA_SYNC_GIVES_UP", "add_k:46"),
        true,
    );
    assert!(
        lines.iter().any(|l| l == "stream-synchronize-gives-up 46"),
        "{lines:#?}"
    );
    assert_launch_failure(&failure, true, &lines);
}

#[test]
fn a_launch_the_driver_refuses_is_settled_and_the_memory_of_its_work_is_freed() {
    // A launch the driver refuses (701: out of resources) never started: settled, the buffer
    // is freed and the device still works. (A sticky fault is settled too, but then the driver
    // refuses every call, frees included, so the fake's log cannot show the free.)
    let (failure, lines) = add_k_failure("refused-settled", ("FAKE_CUDA_FAULT", "add_k:701"), true);
    assert!(
        lines.iter().any(|l| l == "launch-refused add_k status=701"),
        "{lines:#?}"
    );
    assert_launch_failure(&failure, false, &lines);
    assert!(failure.alloc_after.is_ok(), "{:?}", failure.alloc_after);
}

#[test]
fn a_synchronous_launch_whose_wait_gives_up_quarantines_its_memory_too() {
    let (failure, lines) = add_k_failure(
        "sync-launch-gives-up",
        ("FAKE_CUDA_SYNC_GIVES_UP", "add_k:46"),
        false,
    );
    assert!(
        lines.iter().any(|l| l == "stream-synchronize-gives-up 46"),
        "{lines:#?}"
    );
    assert_launch_failure(&failure, true, &lines);
}
