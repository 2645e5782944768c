//! The AMD GPU plugin against a fake HSA runtime (`tests/fake-hsa/fake_hsa.c`, built against the
//! real ROCm headers): a runtime without a GPU that keeps the contracts a plugin can break (copies
//! inside allocations or locked ranges, frees of live allocations, kernel arguments in kernarg
//! memory the GPU may read, packets published before the doorbell) and logs every dispatch with
//! every byte of its kernel arguments. This tests the plugin's device path short of the GPU
//! computing: device properties, loading every image kind, the kernarg layout (explicit and
//! hidden arguments), errors, memory, queues and threads.

use offload_tests::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn log_file(tag: &str) -> PathBuf {
    fake_log("fake-hsa", tag)
}

fn with_fake(args: &[&str], log: &Path, envs: &[(&str, &str)]) -> std::process::Output {
    let lib = fake_hsa_runtime();
    let mut all = vec![
        ("OFFLOAD_HSA_RUNTIME", lib.to_str().unwrap()),
        ("FAKE_HSA_LOG", log.to_str().unwrap()),
    ];
    all.extend_from_slice(envs);
    offload(args, &all)
}

/// A runtime in this process with only the amdgpu plugin, on the fake runtime logging to
/// `log`, with `envs` set too. The environment is set before anything reads it: nextest runs
/// each test in a process of its own.
fn in_process(log: &Path, envs: &[(&str, &str)]) -> offload::Runtime {
    let runtime = fake_hsa_runtime();
    let mut all = vec![
        ("OFFLOAD_HSA_RUNTIME", runtime.to_str().unwrap()),
        ("FAKE_HSA_LOG", log.to_str().unwrap()),
    ];
    all.extend_from_slice(envs);
    runtime_with_env("amdgpu", &all)
}

/// The fake's kernarg pool (`POOL_KERNARG` in tests/fake-hsa/fake_hsa.c).
const KERNARG_POOL: &str = "13";

/// The contracts the fake checks, and balance: every allocation freed once (kernarg areas may
/// stay, at most 64, kept by the device for its next launches), every reader and executable
/// destroyed.
fn assert_contracts_kept(lines: &[String], what: &str) {
    for bad in [
        "bad-free",
        "bad-copy",
        "bad-unlock",
        "use-after-free",
        "bad-packet",
        "no-access",
        "hang",
    ] {
        let hits: Vec<&String> = lines.iter().filter(|l| l.starts_with(bad)).collect();
        assert!(hits.is_empty(), "{what}: {hits:?}");
    }
    let count = |p: &str| lines.iter().filter(|l| l.starts_with(p)).count();
    let kernarg_allocs = count(&format!("alloc {KERNARG_POOL} "));
    let kernarg_frees = count(&format!("free {KERNARG_POOL} "));
    assert_eq!(
        count("alloc ") - kernarg_allocs,
        count("free ") - kernarg_frees,
        "{what}: every allocation freed once\n{lines:#?}"
    );
    assert!(
        kernarg_frees <= kernarg_allocs && kernarg_allocs - kernarg_frees <= 64,
        "{what}: {kernarg_allocs} kernarg areas allocated, {kernarg_frees} freed"
    );
    assert_eq!(count("reader "), count("reader-destroy"), "{what}: readers");
    assert_eq!(count("load"), count("unload"), "{what}: executables");
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn info_shows_the_processor_its_features_and_limits() {
    let log = log_file("info");
    for (isa, cu, features) in [
        (
            "amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-",
            "gfx90a",
            "+sramecc,-xnack",
        ),
        (
            "amdgcn-amd-amdhsa--gfx942:sramecc+:xnack+",
            "gfx942",
            "+sramecc,+xnack",
        ),
        ("amdgcn-amd-amdhsa--gfx1100", "gfx1100", ""),
    ] {
        let out = with_fake(&["info", "--json"], &log, &[("FAKE_HSA_ISA", isa)]);
        assert!(out.status.success(), "{}", stderr(&out));
        let json: Value = serde_json::from_str(&stdout(&out)).unwrap();
        let amd = plugin_json(&json, "amdgpu");
        assert_eq!(amd["status"], "ok", "{amd}");
        let d = &amd["devices"][0];
        assert_eq!(d["name"], "Fake AMD GPU");
        assert_eq!(d["compute_unit"], cu);
        assert_eq!(d["target_features"], features);
        assert_eq!(d["memory_bytes"], 64u64 << 30);
        assert_eq!(d["compute_units"], 110);
        assert_eq!(d["warp_size"], 64);
        assert_eq!(d["max_threads_per_block"], 1024);
        assert_eq!(d["max_block"], serde_json::json!([1024, 1024, 1024]));
    }
    // No GPU agent, and a runtime that fails to start: no devices, in plain words.
    let out = with_fake(&["info", "--json"], &log, &[("FAKE_HSA_NO_GPU", "1")]);
    let json: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let amd = plugin_json(&json, "amdgpu");
    assert_eq!(amd["status"], "no-devices");
    assert!(
        amd["reason"]
            .as_str()
            .unwrap()
            .contains("reports no AMD GPU"),
        "{amd}"
    );
    // A GPU agent that cannot dispatch kernels is no device to launch on.
    let out = with_fake(&["info", "--json"], &log, &[("FAKE_HSA_NO_DISPATCH", "1")]);
    let json: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let amd = plugin_json(&json, "amdgpu");
    assert_eq!(amd["status"], "no-devices");
    assert!(
        amd["reason"]
            .as_str()
            .unwrap()
            .contains("1 GPU agent(s), none of which runs kernels"),
        "{amd}"
    );
    let out = with_fake(&["info", "--json"], &log, &[("FAKE_HSA_INIT_FAILS", "1")]);
    let json: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let amd = plugin_json(&json, "amdgpu");
    assert_eq!(amd["status"], "no-devices");
    let reason = amd["reason"].as_str().unwrap();
    // Without /dev/kfd the reason is the missing driver; with it (an AMD machine), the
    // runtime's failed initialisation. Each machine checks its own case.
    let want = if Path::new("/dev/kfd").exists() {
        "failed to initialise ("
    } else {
        "found no AMD GPU: /dev/kfd does not exist"
    };
    assert!(reason.contains(want), "{reason}");
}

fn dispatches(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .filter(|l| l.starts_with("dispatch "))
        .cloned()
        .collect()
}

fn device_allocations(lines: &[String]) -> Vec<u64> {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix("alloc 11 0x"))
        .map(|l| u64::from_str_radix(l.split(' ').next().unwrap(), 16).unwrap())
        .collect()
}

#[test]
fn every_argument_explicit_and_hidden_is_laid_out_as_the_metadata_says() {
    let dir = scratch("fake-hsa-args");
    let co = dir.join("args16.hsaco");
    std::fs::write(
        &co,
        amdgcn_jit(
            &amdgcn_bitcode("args16", "gfx90a"),
            "gfx90a",
            &[],
            "fake-args16",
        ),
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
        co.to_str().unwrap(),
        "--kernel",
        "args16",
        "--grid",
        "8,2,3",
        "--block",
        "64,2,1",
    ];
    for s in &specs {
        args.extend(["--arg", s]);
    }
    let out = with_fake(&args, &log, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let lines = log_lines(&log);
    let d = dispatches(&lines);
    assert_eq!(d.len(), 1, "{lines:#?}");
    let buffer = device_allocations(&lines)[0];
    let kernarg = d[0].split("kernarg=").nth(1).unwrap().to_string();
    // The metadata of this code object (read independently, by the plugin's reader, from the
    // file) says where each argument goes.
    let image = std::fs::read(&co).unwrap();
    let meta = offload_amdgpu::metadata::read(&image).unwrap();
    let k = meta.kernel("args16").unwrap();
    let want_values: Vec<Vec<u8>> = vec![
        (-1i32).to_le_bytes().to_vec(),
        (-2i64).to_le_bytes().to_vec(),
        3.5f32.to_le_bytes().to_vec(),
        (-4.25f64).to_le_bytes().to_vec(),
        5i32.to_le_bytes().to_vec(),
        6f32.to_le_bytes().to_vec(),
        7f64.to_le_bytes().to_vec(),
        8_000_000_000i64.to_le_bytes().to_vec(),
        9f32.to_le_bytes().to_vec(),
        10f64.to_le_bytes().to_vec(),
        11i32.to_le_bytes().to_vec(),
        12f64.to_le_bytes().to_vec(),
        13f32.to_le_bytes().to_vec(),
        14i64.to_le_bytes().to_vec(),
        buffer.to_le_bytes().to_vec(),
        1000i32.to_le_bytes().to_vec(),
    ];
    let at = |offset: u32, size: u32| &kernarg[2 * offset as usize..2 * (offset + size) as usize];
    for (arg, want) in k.explicit_args().zip(&want_values) {
        assert_eq!(
            at(arg.offset, arg.size),
            hex(want),
            "argument at {}",
            arg.offset
        );
    }
    let mut hidden_seen = 0;
    for arg in &k.args {
        let want: Option<u64> = match arg.value_kind.as_str() {
            "hidden_block_count_x" => Some(8),
            "hidden_block_count_y" => Some(2),
            "hidden_block_count_z" => Some(3),
            "hidden_group_size_x" => Some(64),
            "hidden_group_size_y" => Some(2),
            "hidden_group_size_z" => Some(1),
            "hidden_grid_dims" => Some(3),
            "hidden_remainder_x" | "hidden_remainder_y" | "hidden_remainder_z" => Some(0),
            "hidden_global_offset_x" | "hidden_global_offset_y" | "hidden_global_offset_z" => {
                Some(0)
            }
            _ => None,
        };
        if let Some(v) = want {
            assert_eq!(
                at(arg.offset, arg.size),
                hex(&v.to_le_bytes()[..arg.size as usize]),
                "{}",
                arg.value_kind
            );
            hidden_seen += 1;
        }
    }
    assert!(hidden_seen >= 7, "{:?}", k.args);
    assert!(
        d[0].starts_with(
            "dispatch args16 dims=3 grid=512,4,3 wg=64,2,1 group=0 private=0 barrier "
        ),
        "{}",
        d[0]
    );
    assert_contracts_kept(&lines, "args16");
}

#[test]
fn wrong_arguments_are_refused_before_the_runtime_sees_them() {
    let dir = scratch("fake-hsa-wrong");
    let co = dir.join("saxpy.hsaco");
    std::fs::write(
        &co,
        amdgcn_jit(
            &amdgcn_bitcode("saxpy", "gfx90a"),
            "gfx90a",
            &[],
            "fake-wrong",
        ),
    )
    .unwrap();
    let p = co.to_str().unwrap();
    let cases: [(&[&str], &str); 4] = [
        (
            &["i32:4", "f32:2", "buf:f32:4"],
            "takes 4 argument(s) (of 4, 4, 8, 8 bytes); the launch passes 3",
        ),
        (
            &["i64:4", "f32:2", "buf:f32:4", "buf:f32:4"],
            "argument 0 is 4 bytes in the kernel; the launch passes i64 (8 bytes)",
        ),
        (
            &["i32:4", "f32:2", "u64:7", "buf:f32:4"],
            "argument 2 is a pointer (global_buffer); the launch passes u64",
        ),
        (
            &["i32:4", "f64:2", "buf:f32:4", "buf:f32:4"],
            "argument 1 is 4 bytes in the kernel; the launch passes f64 (8 bytes)",
        ),
    ];
    for (i, (specs, want)) in cases.iter().enumerate() {
        let log = log_file(&format!("wrong-{i}"));
        let mut args = vec!["run", p, "--kernel", "saxpy"];
        for s in specs.iter() {
            args.extend(["--arg", s]);
        }
        let out = with_fake(&args, &log, &[]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains(want) && err.contains("kernel 'saxpy'"),
            "{err}"
        );
        let lines = log_lines(&log);
        assert!(dispatches(&lines).is_empty(), "{lines:#?}");
        assert_contracts_kept(&lines, want);
    }
}

#[test]
fn code_objects_and_bitcode_load_and_dispatch_and_mismatches_are_refused() {
    let dir = scratch("fake-hsa-kinds");
    let bc = amdgcn_bitcode("saxpy", "gfx90a");
    let jit = dir.join("saxpy-jit.hsaco");
    std::fs::write(&jit, amdgcn_jit(&bc, "gfx90a", &[], "kinds-jit")).unwrap();
    let xnack = dir.join("saxpy-xnack.hsaco");
    std::fs::write(
        &xnack,
        amdgcn_jit(&bc, "gfx90a", &["--features", "+xnack"], "kinds-xnack"),
    )
    .unwrap();
    let gfx908 = dir.join("saxpy-908.hsaco");
    std::fs::write(
        &gfx908,
        amdgcn_jit(
            &amdgcn_bitcode("saxpy", "gfx908"),
            "gfx908",
            &[],
            "kinds-908",
        ),
    )
    .unwrap();
    let run_args = |image: &Path| -> Vec<String> {
        [
            "run",
            image.to_str().unwrap(),
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
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    for (image, isa) in [
        (&jit, "amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-"),
        (&xnack, "amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack+"),
        (&bc, "amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-"),
    ] {
        let log = log_file("kinds");
        let a = run_args(image);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        let out = with_fake(&a, &log, &[("FAKE_HSA_ISA", isa)]);
        assert!(
            out.status.success(),
            "{}: {}",
            image.display(),
            stderr(&out)
        );
        let json: Value = serde_json::from_str(&stdout(&out)).unwrap();
        assert_eq!(json["device"], "amdgpu:0");
        // Nothing ran (the fake only logs): the copies both ways are what came back.
        assert_eq!(json["buffers"][1]["head"][0], 1.0, "{json}");
        assert_eq!(json["buffers"][0]["head"][3], 3.0, "{json}");
        let lines = log_lines(&log);
        let d = dispatches(&lines);
        assert_eq!(d.len(), 1, "{lines:#?}");
        assert!(
            d[0].starts_with("dispatch saxpy dims=1 grid=1024,1,1 wg=256,1,1 "),
            "{}",
            d[0]
        );
        if image == &bc {
            assert_eq!(json["jit"]["compiles"], 1, "{json}");
            assert!(
                json["jit"]["post_process"]
                    .as_str()
                    .unwrap()
                    .contains("ld.lld"),
                "{json}"
            );
        }
        assert_contracts_kept(&lines, &image.display().to_string());
    }
    for (image, isa, want) in [
        (
            &xnack,
            "amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-",
            "the code object is for gfx90a:xnack+, this device is gfx90a:sramecc+:xnack-",
        ),
        (
            &gfx908,
            "amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-",
            "the code object is for gfx908",
        ),
        (&jit, "amdgcn-amd-amdhsa--gfx1100", "this device is gfx1100"),
    ] {
        let log = log_file("mismatch");
        let out = with_fake(
            &["run", image.to_str().unwrap(), "--kernel", "saxpy"],
            &log,
            &[("FAKE_HSA_ISA", isa)],
        );
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(want), "{err}");
        assert!(
            !log_lines(&log).iter().any(|l| l.starts_with("reader")),
            "never handed to the runtime"
        );
    }
    // Runtime errors name the call and HSA's words for the status.
    let log = log_file("oom");
    let out = with_fake(
        &[
            "run",
            jit.to_str().unwrap(),
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
        &[("FAKE_HSA_MEMORY", "100")],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("hsa_amd_memory_pool_allocate")
            && err.contains("HSA_STATUS_ERROR_OUT_OF_RESOURCES"),
        "{err}"
    );
    let out = with_fake(
        &["run", jit.to_str().unwrap(), "--kernel", "nope"],
        &log,
        &[],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("kernel 'nope' is not in the code object (it has: saxpy)"),
        "{err}"
    );
}

/// In this process: four threads with queues, events, copies of every kind and frees while
/// queued work still uses the memory; 64 KiB of dynamic LDS; mutated code objects through the
/// plugin to the runtime.
#[test]
fn queues_threads_lds_and_mutants_keep_the_runtime_contracts() {
    use offload::{KernelArg, LaunchDims, MemoryKind};
    let log = log_file("in-process");
    let rt = in_process(&log, &[]);
    let device = rt.device("amdgpu", 0).unwrap();
    let image = amdgcn_jit(
        &amdgcn_bitcode("saxpy", "gfx90a"),
        "gfx90a",
        &[],
        "in-process",
    );
    let program = offload_tests::load(&device, &image).unwrap();
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
                        .unwrap()
                };
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
                        .unwrap()
                };
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
    // Mutants of the code object through the plugin to the runtime: each refused or loaded.
    let noise = random_bytes(3 * 600, 0x4a5);
    let (mut loaded, mut refused) = (0, 0);
    for i in 0..600usize {
        let mut m = image.clone();
        let r = &noise[3 * i..3 * i + 3];
        let at = (usize::from(r[0]) << 8 | usize::from(r[1])) % m.len();
        match i % 3 {
            0 => m[at] ^= r[2] | 1,
            1 => m.truncate(at.max(1)),
            _ => m[at % 64] = r[2],
        }
        match offload_tests::load(&device, &m) {
            Ok(p) => {
                loaded += 1;
                drop(p);
            }
            Err(offload::Error::PluginPanic(e)) => panic!("mutant {i} panicked the plugin: {e}"),
            Err(_) => refused += 1,
        }
    }
    println!("mutants: {loaded} loaded, {refused} refused");
    assert!(loaded > 0 && refused > 0);
    let lines = log_lines(&log);
    let d = dispatches(&lines);
    assert_eq!(d.len(), 4, "{lines:#?}");
    assert_eq!(
        d.iter().filter(|l| l.contains(" group=65536 ")).count(),
        1,
        "{d:#?}"
    );
    let count = |p: &str| lines.iter().filter(|l| l.starts_with(p)).count();
    // Four queues of the layer, each destroyed with its queue.
    assert_eq!(count("queue-create"), 4, "{lines:#?}");
    assert_eq!(count("queue-destroy"), 4);
    assert_contracts_kept(&lines, "threads, queues and mutants");
}

#[test]
fn overlapping_device_copies_reach_the_runtime_as_disjoint_ones() {
    // As for CUDA: the fake's DMA engine gets overlapping copies wrong.
    let log = log_file("overlap");
    let rt = in_process(&log, &[]);
    let device = rt.device("amdgpu", 0).unwrap();
    check_overlapping_device_copies(&device, 0xc0_9e13, 400);
    let lines = std::fs::read_to_string(&log).unwrap_or_default();
    let overlapping: Vec<&str> = lines
        .lines()
        .filter(|l| l.starts_with("overlapping-copy"))
        .collect();
    assert!(overlapping.is_empty(), "{overlapping:?}");
}

#[test]
fn blocks_larger_than_the_kernel_s_max_flat_workgroup_size_are_refused() {
    // OpenCL C (whose default is 256) and HIP's __launch_bounds__ compile a kernel for fewer
    // work items than the device allows: the code object's `.max_flat_workgroup_size` is the
    // limit.
    let image = opencl_code_object(
        "bounded",
        "__kernel void bounded(int n, __global float *y) {\n\
           unsigned i = __builtin_amdgcn_workgroup_id_x() * 64 + __builtin_amdgcn_workitem_id_x();\n\
           if (i < (unsigned)n) y[i] = 1.0f; }\n",
    );
    for (block, ok) in [
        ("512", false),
        ("256", true),
        ("64,4", true),
        ("64,8", false),
    ] {
        let log = log_file(&format!("bounded-{block}"));
        let out = with_fake(
            &[
                "run",
                image.to_str().unwrap(),
                "--kernel",
                "bounded",
                "--block",
                block,
                "--arg",
                "i32:16",
                "--arg",
                "buf:f32:16",
            ],
            &log,
            &[],
        );
        let err = stderr(&out);
        assert_eq!(out.status.success(), ok, "block {block}: {err}");
        let dispatched = log_lines(&log).iter().any(|l| l.starts_with("dispatch"));
        assert_eq!(dispatched, ok, "block {block}");
        if !ok {
            assert!(
                err.contains("kernel 'bounded' runs at most 256 threads per block (its .max_flat_workgroup_size)"),
                "{err}"
            );
        }
    }
}

/// An OpenCL C source compiled for gfx90a through the JIT: the code object's path.
fn opencl_code_object(tag: &str, source: &str) -> std::path::PathBuf {
    let dir = scratch(&format!("amdgpu-cl-{tag}"));
    let src = dir.join(format!("{tag}.cl"));
    std::fs::write(&src, source).unwrap();
    let bc = dir.join(format!("{tag}.bc"));
    clang(&[
        "-O2",
        "-emit-llvm",
        "-c",
        "-x",
        "cl",
        "-cl-std=CL2.0",
        "-target",
        AMDGCN,
        "-mcpu=gfx90a",
        "-nogpulib",
        src.to_str().unwrap(),
        "-o",
        bc.to_str().unwrap(),
    ]);
    let image = dir.join(format!("{tag}.hsaco"));
    std::fs::write(&image, amdgcn_jit(&bc, "gfx90a", &[], tag)).unwrap();
    image
}

#[test]
fn kernels_with_a_dynamic_stack_get_scratch_for_it() {
    // Recursion gives a kernel `.uses_dynamic_stack: true`: its fixed private segment does not
    // cover the stack, and the dispatch asks for 1 KiB more per work item (HIP's default).
    let dir = scratch("amdgpu-dynamic-stack");
    let src = dir.join("rec.c");
    std::fs::write(
        &src,
        "#include \"offload_kernel.h\"\n\
         __attribute__((noinline)) static unsigned fib(unsigned n) {\n\
           return n < 2 ? n : fib(n - 1) + fib(n - 2);\n\
         }\n\
         OFFLOAD_KERNEL void rec(unsigned *out, int n) {\n\
           unsigned i = offload_global_id_x();\n\
           if (i < (unsigned)n) out[i] = fib(i % 12);\n\
         }\n",
    )
    .unwrap();
    let bc = dir.join("rec.bc");
    let include = repo_root().join("include");
    clang(&[
        "-O2",
        "-emit-llvm",
        "-c",
        "-target",
        AMDGCN,
        "-mcpu=gfx90a",
        "-nogpulib",
        "-I",
        include.to_str().unwrap(),
        src.to_str().unwrap(),
        "-o",
        bc.to_str().unwrap(),
    ]);
    let rec = amdgcn_jit(&bc, "gfx90a", &[], "dynamic-stack");
    let saxpy = amdgcn_jit(
        &amdgcn_bitcode("saxpy", "gfx90a"),
        "gfx90a",
        &[],
        "no-stack",
    );
    let log = log_file("dynamic-stack");
    let rt = in_process(&log, &[]);
    let device = rt.device("amdgpu", 0).unwrap();
    let out = device.alloc::<u32>(64).unwrap();
    let program = offload_tests::load(&device, &rec).unwrap();
    let k = program.kernel("rec").unwrap();
    // SAFETY: `out` holds the 64 words the kernel writes.
    unsafe {
        k.launch(offload::LaunchDims::linear(1, 64))
            .args_raw(&[
                offload::KernelArg::Ptr(out.ptr()),
                offload::KernelArg::I32(64),
            ])
            .unchecked()
            .run()
    }
    .unwrap();
    let program = offload_tests::load(&device, &saxpy).unwrap();
    let k = program.kernel("saxpy").unwrap();
    // SAFETY: n = 0: the kernel touches nothing.
    unsafe {
        k.launch(offload::LaunchDims::linear(1, 64))
            .args_raw(&[
                offload::KernelArg::I32(0),
                offload::KernelArg::F32(1.0),
                offload::KernelArg::Ptr(out.ptr()),
                offload::KernelArg::Ptr(out.ptr()),
            ])
            .unchecked()
            .run()
    }
    .unwrap();
    let lines = log_lines(&log);
    let private = |kernel: &str| -> u32 {
        let line = lines
            .iter()
            .find(|l| l.starts_with(&format!("dispatch {kernel} ")))
            .unwrap_or_else(|| panic!("no dispatch of {kernel}: {lines:#?}"));
        line.split(" private=")
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert!(private("rec") >= 1024, "rec: private={}", private("rec"));
    assert!(
        private("saxpy") < 1024,
        "saxpy: private={}",
        private("saxpy")
    );
}

#[test]
fn a_gpu_memory_fault_fails_its_launch_instead_of_ending_the_process() {
    // ROCr aborts the process on a memory fault unless a system event handler handles it
    // (the fake does the same): the plugin's handler turns it into an error of the launch.
    let image = amdgcn_jit(&amdgcn_bitcode("saxpy", "gfx90a"), "gfx90a", &[], "fault");
    let path = scratch("amdgpu-fault").join("saxpy.hsaco");
    std::fs::write(&path, image).unwrap();
    let run = |tag: &str, fault: &str| {
        let log = log_file(tag);
        let out = with_fake(
            &[
                "run",
                path.to_str().unwrap(),
                "--kernel",
                "saxpy",
                "--block",
                "64",
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
            &[("FAKE_HSA_FAULT", fault)],
        );
        (out, log_lines(&log))
    };
    let (out, lines) = run("memory-fault", "saxpy:memory");
    let err = stderr(&out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "the process must not be killed: {err}"
    );
    assert!(
        err.contains("memory access fault by the GPU at address 0xdead0000 (page not present")
            && err.contains("restart the process"),
        "{err}"
    );
    assert!(lines.iter().any(|l| l == "memory-fault 0xdead0000 handled"));
    // The faulting dispatch never completed: its kernel-argument area is never freed (the GPU
    // may still read it); every other one is.
    let count = |p: &str| lines.iter().filter(|l| l.starts_with(p)).count();
    assert_eq!(
        count(&format!("alloc {KERNARG_POOL} ")),
        count(&format!("free {KERNARG_POOL} ")) + 1,
        "{lines:#?}"
    );
    // A queue error (a trap): the launch fails naming the queue's status.
    let (out, _) = run("queue-error", "saxpy:queue");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("kernel 'saxpy'") && err.contains("queue"),
        "{err}"
    );
}

#[test]
fn copies_from_and_to_runtime_allocated_host_memory_do_not_lock_it() {
    // ROCr cannot lock memory it allocated itself (pinned host and shared memory): such a
    // host side is used where it is.
    let log = log_file("hsa-host-memory");
    let rt = in_process(&log, &[]);
    let device = rt.device("amdgpu", 0).unwrap();
    let mut pinned = device.alloc_host::<u32>(1024).unwrap();
    for (i, v) in pinned.as_mut_slice().unwrap().iter_mut().enumerate() {
        *v = i as u32 * 3;
    }
    let dbuf = device.alloc::<u32>(1024).unwrap();
    dbuf.write(pinned.as_slice().unwrap()).unwrap();
    let mut back = device.alloc_shared::<u32>(1024).unwrap();
    dbuf.read(back.as_mut_slice().unwrap()).unwrap();
    assert_eq!(back.as_slice().unwrap(), pinned.as_slice().unwrap());
    // Pageable memory is still locked for the copy.
    let v: Vec<u32> = (0..1024).collect();
    dbuf.write(&v).unwrap();
    assert_eq!(dbuf.to_vec().unwrap(), v);
    drop((pinned, back, dbuf));
    let lines = log_lines(&log);
    assert!(
        !lines.iter().any(|l| l.starts_with("lock-of-hsa-memory")),
        "{lines:#?}"
    );
    assert_contracts_kept(&lines, "host memory copies");
}

#[test]
fn copies_of_one_host_buffer_from_several_threads_keep_it_locked_until_the_last_has_run() {
    // Thread A locks the buffer for its copy; thread B, copying the same buffer (or a part),
    // must not take A's lock as its own: A's unlock would pull the pages from under B's DMA
    // (the fake's DMA engine says "use-after-free copy" when its host side is unlocked).
    let log = log_file("hsa-shared-lock");
    let rt = in_process(&log, &[]);
    let device = rt.device("amdgpu", 0).unwrap();
    let host: Vec<u32> = (0..4096).map(|i| i * 7 + 1).collect();
    std::thread::scope(|scope| {
        for t in 0..4usize {
            let (device, host) = (&device, &host);
            scope.spawn(move || {
                let whole = device.alloc::<u32>(4096).unwrap();
                let part = device.alloc::<u32>(1024).unwrap();
                for round in 0..40 {
                    if (round + t) % 3 == 0 {
                        part.write(&host[1024..2048]).unwrap();
                        assert_eq!(part.to_vec().unwrap(), &host[1024..2048], "thread {t}");
                    } else {
                        whole.write(host).unwrap();
                        assert_eq!(whole.to_vec().unwrap(), *host, "thread {t}");
                    }
                }
            });
        }
    });
    drop(device);
    drop(rt);
    assert_contracts_kept(
        &log_lines(&log),
        "one host buffer copied by several threads",
    );
}

/// Constants in read-only pages, as a program's tables are.
static READ_ONLY_TABLE: [u32; 2048] = {
    let mut t = [0u32; 2048];
    let mut i = 0;
    while i < 2048 {
        t[i] = (i as u32).wrapping_mul(2654435761);
        i += 1;
    }
    t
};

#[test]
fn copies_from_read_only_memory_go_through_a_staging_buffer() {
    // The runtime cannot lock read-only pages (the fake refuses as the kernel driver does):
    // such a source is copied through pinned memory; the result is the same.
    let log = log_file("hsa-read-only");
    let rt = in_process(&log, &[]);
    let device = rt.device("amdgpu", 0).unwrap();
    let dbuf = device.alloc::<u32>(2048).unwrap();
    dbuf.write(&READ_ONLY_TABLE).unwrap();
    assert_eq!(dbuf.to_vec().unwrap(), READ_ONLY_TABLE);
    drop(dbuf);
    drop(device);
    drop(rt);
    let lines = log_lines(&log);
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("lock-refused read-only")),
        "the table was expected in read-only pages: {lines:#?}"
    );
    assert_contracts_kept(&lines, "a read-only source");
}

#[test]
fn copies_to_pageable_host_memory_go_through_a_staging_buffer_in_chunks() {
    // The DMA never writes the program's own memory: it fills pinned staging memory, which
    // the CPU copies out of; a copy longer than the staging buffer (64 MiB) goes in chunks,
    // and every byte arrives.
    let log = log_file("hsa-staged-read");
    let rt = in_process(&log, &[]);
    let device = rt.device("amdgpu", 0).unwrap();
    let n = (64 << 20) / 4 + 3000; // 64 MiB and 12000 bytes of u32
    let v: Vec<u32> = (0..n as u32).map(|i| i.wrapping_mul(2654435761)).collect();
    let dbuf = device.upload(&v).unwrap();
    let mut back = vec![0u32; n];
    dbuf.read(&mut back).unwrap();
    assert!(
        back == v,
        "the chunked copy to the host lost or moved bytes"
    );
    let mut small = vec![0u32; 10];
    dbuf.slice(5..15).unwrap().read(&mut small).unwrap();
    assert_eq!(small, v[5..15]);
    drop(dbuf);
    drop(device);
    drop(rt);
    let lines = log_lines(&log);
    let copies: Vec<&String> = lines.iter().filter(|l| l.starts_with("copy ")).collect();
    // The upload (one DMA), the read (two chunks), the small read (one).
    assert_eq!(
        copies,
        [
            &format!("copy {}", n * 4),
            &format!("copy {}", 64 << 20),
            &"copy 12000".to_string(),
            &"copy 40".to_string()
        ],
        "{lines:#?}"
    );
    assert_contracts_kept(&lines, "staged copies to the host");
}

#[test]
fn a_copy_to_the_host_that_never_settles_can_write_its_staging_buffer_only() {
    hung_copy_to_the_host("hsa-copy-hangs", HungRead::Pageable);
}

#[test]
fn a_queued_copy_to_lent_host_memory_that_never_settles_cannot_write_it_either() {
    hung_copy_to_the_host("hsa-queued-copy-hangs", HungRead::PageableQueued);
}

#[test]
fn a_copy_to_pinned_host_memory_that_never_settles_cannot_write_it_either() {
    // A HostBuffer of the device, which the program has as a slice: staged too.
    hung_copy_to_the_host("hsa-pinned-copy-hangs", HungRead::Pinned);
}

/// A read whose DMA faults the GPU and hangs (FAKE_HSA_COPY_HANGS), [`hung_read`].
fn hung_copy_to_the_host(tag: &str, how: HungRead) {
    let log = log_file(tag);
    let rt = in_process(&log, &[("FAKE_HSA_COPY_HANGS", "4000")]);
    let device = rt.device("amdgpu", 0).unwrap();
    let e = hung_read(
        &device,
        &fake_hsa_runtime(),
        "fake_hsa_finish_held_copies",
        how,
        &log,
    );
    assert!(e.to_string().contains("memory access fault"), "{e}");
    // The device stays failed, naming the fault.
    let later = device.alloc::<u32>(4).map(drop).unwrap_err();
    assert!(later.to_string().contains("memory access fault"), "{later}");
}

#[test]
fn local_pointer_arguments_get_lds_of_the_size_the_launch_passes() {
    let image = opencl_code_object(
        "lds",
        "__kernel void lds(int n, __local float *tmp, __global float *y) {\n\
           unsigned i = __builtin_amdgcn_workitem_id_x();\n\
           tmp[i] = (float)i;\n\
           __builtin_amdgcn_s_barrier();\n\
           if (i < (unsigned)n) y[i] = tmp[n - 1 - i]; }\n",
    );
    let run_image = |image: &Path, tag: &str, tmp: &str, shared: &str| {
        let log = log_file(tag);
        let out = with_fake(
            &[
                "run",
                image.to_str().unwrap(),
                "--kernel",
                "lds",
                "--block",
                "64",
                "--shared-mem",
                shared,
                "--arg",
                "i32:64",
                "--arg",
                tmp,
                "--arg",
                "buf:f32:64",
            ],
            &log,
            &[],
        );
        (out, log_lines(&log))
    };
    let run = |tag: &str, tmp: &str, shared: &str| run_image(&image, tag, tmp, shared);
    // 256 bytes for `tmp` after 100 bytes of dynamic shared memory: its offset is 100 rounded
    // up to the argument's 4-byte alignment, and the work-group has 356 bytes of LDS.
    let (out, lines) = run("lds-ok", "u32:256", "100");
    assert!(out.status.success(), "{}", stderr(&out));
    let dispatch = lines
        .iter()
        .find(|l| l.starts_with("dispatch lds"))
        .expect("dispatched");
    assert!(dispatch.contains("group=356 "), "{dispatch}");
    // The same kernel as bitcode, compiled at load: the JIT's signature calls the LDS pointer a
    // size too (LLVM says `ptr addrspace(3)`), so the same launch runs.
    let (out, jit_lines) = run_image(&image.with_extension("bc"), "lds-jit", "u32:256", "100");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        jit_lines
            .iter()
            .any(|l| l.starts_with("dispatch lds") && l.contains("group=356 ")),
        "{jit_lines:#?}"
    );
    let kernarg = dispatch.split("kernarg=").nth(1).unwrap();
    // n at 0 (64), tmp's LDS offset at 4 (100), y at 8.
    assert_eq!(
        &kernarg[..16],
        format!("{}{}", le(&64u32.to_le_bytes()), le(&100u32.to_le_bytes())),
        "{dispatch}"
    );
    // A device pointer where the kernel takes a __local pointer: refused, saying what to pass.
    let (out, lines) = run("lds-ptr", "buf:f32:64", "0");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("argument 1 is a `__local` pointer (a pointer to LDS the launch sizes)")
            && err.contains("u32"),
        "{err}"
    );
    assert!(!lines.iter().any(|l| l.starts_with("dispatch")));
    // More LDS than a work-group has: refused with the numbers, before the runtime.
    let (out, lines) = run("lds-too-much", "u32:8192", "60000");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("needs 68192 bytes of LDS per work-group")
            && err.contains("has at most 65536"),
        "{err}"
    );
    assert!(!lines.iter().any(|l| l.starts_with("dispatch")));
}

fn le(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn completion_signals_and_kernarg_areas_are_reused() {
    // A signal per operation and a kernarg allocation per launch cost a runtime call each
    // (tens of microseconds on ROCm): a device keeps them for its next operations.
    let log = log_file("reuse");
    let rt = in_process(&log, &[]);
    let device = rt.device("amdgpu", 0).unwrap();
    let image = amdgcn_jit(&amdgcn_bitcode("add_k", "gfx90a"), "gfx90a", &[], "reuse");
    let program = offload_tests::load(&device, &image).unwrap();
    let add = program.kernel("add_k").unwrap();
    let n = 4096usize;
    let mut x = device.alloc::<u32>(n).unwrap();
    x.fill(0).unwrap();
    let dims = offload::LaunchDims::for_elems(n as u64, 256).unwrap();
    for _ in 0..50 {
        add.launch(dims)
            .arg(n as i32)
            .arg(3u32)
            .arg(&mut x)
            .run()
            .unwrap();
        assert_eq!(x.to_vec().unwrap()[n - 1] % 3, 0);
    }
    assert!(x.to_vec().unwrap().iter().all(|v| *v == 150));
    drop((add, program, x));
    let lines = log_lines(&log);
    let count = |p: &str| lines.iter().filter(|l| l.starts_with(p)).count();
    assert_eq!(count("dispatch add_k"), 50);
    // 50 launches and 101 copies; one signal and one kernarg area would do, a few are allowed
    // for the parameter record's read and the fill.
    assert!(
        count("signal-create") <= 4,
        "{} signals",
        count("signal-create")
    );
    let kernargs = count(&format!("alloc {KERNARG_POOL} "));
    assert!(kernargs <= 2, "{kernargs} kernarg areas for 50 launches");
    assert_contracts_kept(&lines, "reuse");
}

#[test]
fn random_queued_work_on_several_threads_matches_the_model() {
    // As on the fake CUDA driver: add_k runs later, on the queue's thread; copies on the DMA
    // engine's. A missing wait or an early free shows as a wrong read.
    let log = log_file("random-queued");
    let rt = in_process(&log, &[]);
    let device = rt.device("amdgpu", 0).unwrap();
    let image = amdgcn_jit(&amdgcn_bitcode("add_k", "gfx90a"), "gfx90a", &[], "add_k");
    let program = offload_tests::load(&device, &image).unwrap();
    let add = program.kernel("add_k").unwrap();
    check_random_queued_work(&device, &add, 0xa3d);
    drop((add, program));
    let lines = log_lines(&log);
    assert!(
        lines
            .iter()
            .filter(|l| l.starts_with("dispatch add_k"))
            .count()
            > 100
    );
    for bad in ["use-after-free", "memory-fault", "queue-error"] {
        let hits: Vec<&String> = lines.iter().filter(|l| l.starts_with(bad)).collect();
        assert!(hits.is_empty(), "{hits:?}");
    }
    assert_contracts_kept(&lines, "random queued work");
}

#[test]
fn the_gpu_check_runs_end_to_end_against_the_fake_runtime() {
    // As for CUDA: `scripts/gpu-check.sh amdgpu dry-run` through a pipe, with the fake HSA
    // runtime; every step runs, the kernels the fake does not compute go uncompared.
    let run = assert_gpu_check_dry_run("amdgpu", &GPU_CHECK_EXTRAS, None);
    let log = &run.log;
    assert!(log.contains("scan       skipped: 96 KiB"), "{log}");
    // LLVM's suite, recorded and replayed: amdgcn JIT and AOT, two tests each.
    assert_eq!(assert_suite_replayed(log, 2), 2);
}

/// An add_k launch, queued or not, on the fake runtime that `env` makes fail ([`fail_a_launch`]),
/// and the runtime's log.
fn add_k_failure(tag: &str, env: (&str, &str), queued: bool) -> (LaunchFailure, Vec<String>) {
    let log = log_file(tag);
    let rt = in_process(&log, &[env]);
    let device = rt.device("amdgpu", 0).unwrap();
    let image = amdgcn_jit(&amdgcn_bitcode("add_k", "gfx90a"), "gfx90a", &[], tag);
    let program = offload_tests::load(&device, &image).unwrap();
    let add = program.kernel("add_k").unwrap();
    let failure = fail_a_launch(&device, &add, queued);
    drop((add, program, device, rt));
    (failure, log_lines(&log))
}

#[test]
fn a_memory_fault_under_a_dispatch_quarantines_the_memory_of_its_work_and_fails_the_device() {
    // The wait for the dispatch ends with the fault, not with its completion signal: the GPU
    // may still run it, so its buffer must never be freed, and the device takes no more.
    let (failure, lines) =
        add_k_failure("fault-unsettled", ("FAKE_HSA_FAULT", "add_k:memory"), true);
    assert!(
        lines.iter().any(|l| l == "memory-fault 0xdead0000 handled"),
        "{lines:#?}"
    );
    assert_launch_failure(&failure, true, &lines);
}

#[test]
fn a_queue_error_is_settled_and_the_memory_of_its_work_is_freed() {
    // A queue error halts the queue: nothing of the dispatch runs on, so the buffer is freed,
    // and the device still works (a new queue, a new allocation).
    let (failure, lines) = add_k_failure("queue-settled", ("FAKE_HSA_FAULT", "add_k:queue"), true);
    assert!(
        lines.iter().any(|l| l.starts_with("queue-error")),
        "{lines:#?}"
    );
    assert_launch_failure(&failure, false, &lines);
    assert!(failure.alloc_after.is_ok(), "{:?}", failure.alloc_after);
}

#[test]
fn a_memory_fault_under_a_synchronous_dispatch_quarantines_its_memory_too() {
    let (failure, lines) = add_k_failure(
        "sync-fault-unsettled",
        ("FAKE_HSA_FAULT", "add_k:memory"),
        false,
    );
    assert!(
        lines.iter().any(|l| l == "memory-fault 0xdead0000 handled"),
        "{lines:#?}"
    );
    assert_launch_failure(&failure, true, &lines);
}
