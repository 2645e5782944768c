//! The Level Zero plugin against a fake GPU driver (`tests/fake-level-zero/fake_ze.c`) that the
//! real loader (Debian's libze1) loads through `ZE_ENABLE_ALT_DRIVERS`: a driver without a GPU
//! that runs immediate command lists later, on a thread of their own, computes saxpy, add_k and
//! a work-group reversal through local memory and a barrier, loses the device on a faulting
//! kernel, and logs every launch with every argument's bytes. This tests the plugin's device
//! path through the real loader short of a GPU computing: properties, SPIR-V and native
//! modules, arguments, copies, queues, memory kinds and errors.

use offload::{KernelArg, LaunchDims};
use offload_tests::*;
use std::path::{Path, PathBuf};

fn log_file(tag: &str) -> PathBuf {
    fake_log("fake-level-zero", tag)
}

/// The fake driver's settings for `log` (and `envs`), as the loader and the fake read them.
fn fake_env<'a>(log: &'a Path, envs: &[(&'a str, &'a str)]) -> Vec<(String, String)> {
    let mut all = vec![
        (
            "ZE_ENABLE_ALT_DRIVERS".to_string(),
            fake_ze_driver().to_str().unwrap().to_string(),
        ),
        ("FAKE_ZE_LOG".to_string(), log.to_str().unwrap().to_string()),
    ];
    all.extend(envs.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    all
}

/// Runs `offload` with the fake driver.
fn with_fake(args: &[&str], log: &Path, envs: &[(&str, &str)]) -> std::process::Output {
    let all = fake_env(log, envs);
    let refs: Vec<(&str, &str)> = all.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    offload(args, &refs)
}

/// A runtime in this process with only the level-zero plugin, on the fake driver logging to
/// `log`. The environment is set before anything reads it: nextest runs each test in a process
/// of its own (the loader reads it once, at the first zeInit).
fn in_process(log: &Path, envs: &[(&str, &str)]) -> offload::Runtime {
    let all = fake_env(log, envs);
    let refs: Vec<(&str, &str)> = all.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    runtime_with_env("level-zero", &refs)
}

/// The driver contracts the fake checks: no call on a context that is not one, no copy outside
/// an allocation, no free of something not allocated, no work that runs after its memory was
/// freed, no wait that never ends, no two threads appending to one immediate list at once, no
/// memory of another context, no host wait on an event the host cannot wait for; every
/// allocation freed.
fn assert_contracts_kept(lines: &[String], what: &str) {
    for bad in [
        "bad-context",
        "bad-copy",
        "bad-free",
        "use-after-free",
        "hang",
        "bad-stype",
        "concurrent-append",
        "wrong-context",
        "event-not-host-visible",
    ] {
        let hits: Vec<&String> = lines.iter().filter(|l| l.starts_with(bad)).collect();
        assert!(hits.is_empty(), "{what}: {hits:?}");
    }
    let count = |p: &str| lines.iter().filter(|l| l.starts_with(p)).count();
    assert_eq!(
        count("alloc "),
        count("free "),
        "{what}: every allocation freed\n{lines:#?}"
    );
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `reverse(in, out, __local tmp)` over `groups` work-groups of `l` items, `local` its third
/// argument and `shared` bytes of dynamic shared memory: the launch's error, or `Ok` once each
/// group of the output has come back as its input reversed.
fn run_reverse(
    device: &offload::Device,
    k: &offload::Kernel,
    (groups, l): (usize, usize),
    local: KernelArg,
    shared: u32,
) -> offload::Result<()> {
    let input: Vec<u32> = (0..(groups * l) as u32).map(|i| i * 7).collect();
    let inb = device.upload(&input).unwrap();
    let out = device.alloc::<u32>(groups * l).unwrap();
    let mut dims = LaunchDims::linear(groups as u32, l as u32);
    dims.shared_mem_bytes = shared;
    // SAFETY: both buffers hold groups * l words, all the kernel touches.
    unsafe {
        k.launch(dims)
            .args_raw(&[KernelArg::Ptr(inb.ptr()), KernelArg::Ptr(out.ptr()), local])
            .unchecked()
            .run()
    }?;
    let got = out.to_vec().unwrap();
    for g in 0..groups {
        for i in 0..l {
            assert_eq!(
                got[g * l + i],
                input[g * l + l - 1 - i],
                "group {g} item {i}"
            );
        }
    }
    Ok(())
}

#[test]
fn info_shows_each_gpu_with_its_ip_version_and_limits() {
    let log = log_file("info");
    let out = with_fake(&["info", "--json"], &log, &[("FAKE_ZE_DEVICES", "2")]);
    assert!(out.status.success(), "{}", stderr(&out));
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let p = plugin_json(&info, "level-zero");
    assert_eq!(p["status"], "ok", "{p}");
    let devices = p["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2, "{p}");
    assert_eq!(devices[1]["name"], "Fake Level Zero GPU 1");
    assert_eq!(devices[0]["compute_unit"], "intel-gpu-12.55.4");
    let text = stdout(&with_fake(&["info"], &log, &[]));
    assert!(text.contains("64 compute units, warp 32"), "{text}");
    assert!(text.contains("grid up to 65535x65535x65535"), "{text}");
    // A driver that does not answer the IP version extension: the PCI device id.
    let out = with_fake(&["info", "--json"], &log, &[("FAKE_ZE_IP_VERSION", "0")]);
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let p = plugin_json(&info, "level-zero");
    assert_eq!(p["devices"][0]["compute_unit"], "intel-gpu-0x0bd5", "{p}");
}

#[test]
fn saxpy_from_spirv_runs_with_every_argument_byte_as_the_kernel_declares_it() {
    let log = log_file("saxpy");
    let rt = in_process(&log, &[]);
    let device = rt.device("level-zero", 0).unwrap();
    let program = offload_tests::load(&device, &spirv("saxpy")).unwrap();
    let k = program.kernel("saxpy").unwrap();
    let n = 1000usize;
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let xb = device.upload(&x).unwrap();
    let yb = device.upload(&vec![1.0f32; n]).unwrap();
    // SAFETY: both buffers hold n floats, all the kernel touches.
    unsafe {
        k.launch(LaunchDims::for_elems(n as u64, 128).unwrap())
            .args_raw(&[
                KernelArg::I32(n as i32),
                KernelArg::F32(2.5),
                KernelArg::Ptr(xb.ptr()),
                KernelArg::Ptr(yb.ptr()),
            ])
            .unchecked()
            .run()
    }
    .unwrap();
    let y = yb.to_vec().unwrap();
    assert!((0..n).all(|i| y[i] == 2.5 * i as f32 + 1.0));
    drop((xb, yb, k, program));
    drop(rt);
    let lines = log_lines(&log);
    let launch = lines
        .iter()
        .find(|l| l.starts_with("launch saxpy"))
        .unwrap_or_else(|| panic!("{lines:#?}"));
    assert!(
        launch.starts_with("launch saxpy groups=8,1,1 group=128,1,1 args="),
        "{launch}"
    );
    let args: Vec<&str> = launch.split("args=").nth(1).unwrap().split(',').collect();
    assert_eq!(args[0], hex(&(n as i32).to_le_bytes()));
    assert_eq!(args[1], hex(&2.5f32.to_le_bytes()));
    assert_eq!(args[2].len(), 16);
    assert_eq!(args[3].len(), 16);
    assert_contracts_kept(&lines, "saxpy");
}

#[test]
fn a_barrier_kernel_gets_local_memory_of_the_size_the_launch_passes() {
    let log = log_file("reverse");
    let rt = in_process(&log, &[]);
    let device = rt.device("level-zero", 0).unwrap();
    let program = offload_tests::load(&device, &spirv("reverse")).unwrap();
    let k = program.kernel("reverse").unwrap();
    let launch = |local: KernelArg, shared: u32| run_reverse(&device, &k, (16, 256), local, shared);
    launch(KernelArg::U32(256 * 4), 0).unwrap();
    // The `__local` size must be positive and fit the device's 64 KiB.
    let e = launch(KernelArg::U32(0), 0).unwrap_err().to_string();
    assert!(
        e.contains("`__local` pointer") && e.contains("at least 1; the launch passes 0"),
        "{e}"
    );
    let e = launch(KernelArg::U32(80 << 10), 0).unwrap_err().to_string();
    assert!(
        e.contains("needs 81920 bytes of local memory per work-group") && e.contains("65536"),
        "{e}"
    );
    // Dynamic shared memory is not how Level Zero kernels get local memory: said so.
    let e = launch(KernelArg::U32(1024), 1024).unwrap_err().to_string();
    assert!(
        e.contains("`__local`") && e.contains("1024 bytes asked for"),
        "{e}"
    );
    drop((k, program));
    drop(rt);
    let lines = log_lines(&log);
    let launches: Vec<&String> = lines
        .iter()
        .filter(|l| l.starts_with("launch reverse"))
        .collect();
    assert_eq!(launches.len(), 1, "{lines:#?}");
    assert!(launches[0].ends_with(",local:1024"), "{}", launches[0]);
    assert_contracts_kept(&lines, "reverse");
}

#[test]
fn overlapping_device_copies_give_memmove_s_result() {
    // The fake's copy engine gets overlapping copies wrong, as a real one may: the layer hands
    // the driver disjoint pieces.
    let log = log_file("copies");
    let rt = in_process(&log, &[("FAKE_ZE_DELAY_US", "0")]);
    let device = rt.device("level-zero", 0).unwrap();
    check_overlapping_device_copies(&device, 0x1e0, 200);
    drop(device);
    drop(rt);
    let lines = log_lines(&log);
    assert!(
        !lines.iter().any(|l| l.starts_with("overlapping-copy")),
        "the driver saw an overlapping copy"
    );
    assert_contracts_kept(&lines, "copies");
}

#[test]
fn random_queued_work_on_several_threads_matches_the_model() {
    let log = log_file("queued");
    let rt = in_process(&log, &[]);
    let device = rt.device("level-zero", 0).unwrap();
    let program = offload_tests::load(&device, &spirv("add_k")).unwrap();
    let add = program.kernel("add_k").unwrap();
    check_random_queued_work(&device, &add, 0x1e0e);
    drop((add, program, device));
    drop(rt);
    let lines = log_lines(&log);
    assert!(
        lines
            .iter()
            .filter(|l| l.starts_with("launch add_k"))
            .count()
            > 100
    );
    assert_contracts_kept(&lines, "random queued work");
}

#[test]
fn queued_work_runs_back_to_back_and_keeps_its_memory_until_it_has_run() {
    // Each operation runs 3 ms after the one before: anything released or read early shows.
    let log = log_file("back-to-back");
    let rt = in_process(&log, &[("FAKE_ZE_DELAY_US", "3000")]);
    let device = rt.device("level-zero", 0).unwrap();
    let program = offload_tests::load(&device, &spirv("add_k")).unwrap();
    let add = program.kernel("add_k").unwrap();
    let n = 1000usize;
    let dims = LaunchDims::for_elems(n as u64, 128).unwrap();
    let queue = device.queue().unwrap();
    let mut x = device.alloc::<u32>(n).unwrap();
    x.fill(1).unwrap();
    for _ in 0..5 {
        // SAFETY: add_k touches x[0..n).
        unsafe {
            add.launch(dims)
                .arg(n as i32)
                .arg(2u32)
                .arg(&mut x)
                .on(&queue)
                .unchecked()
                .run()
        }
        .unwrap();
    }
    let after = queue.record().unwrap();
    assert!(x.to_vec().unwrap().iter().all(|v| *v == 11));
    after.synchronize().unwrap();
    let mut y = device.alloc::<u32>(n).unwrap();
    y.fill(0).unwrap();
    // SAFETY: as above.
    unsafe {
        add.launch(dims)
            .arg(n as i32)
            .arg(7u32)
            .arg(&mut y)
            .on(&queue)
            .unchecked()
            .run()
    }
    .unwrap();
    drop(y);
    queue.synchronize().unwrap();
    drop((x, queue, add, program, device));
    drop(rt);
    let lines = log_lines(&log);
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.starts_with("launch add_k"))
            .count(),
        6
    );
    assert_contracts_kept(&lines, "back to back");
}

#[test]
fn a_native_binary_loads_and_runs() {
    let log = log_file("zebin");
    let rt = in_process(&log, &[]);
    let device = rt.device("level-zero", 0).unwrap();
    let zebin = synthetic_zebin(&[("add_k", 3, 0), ("other", 1, 0)], None);
    // Routed by its ELF machine.
    assert_eq!(rt.route(&zebin).unwrap().plugin_name(), "level-zero");
    let program = offload_tests::load(&device, &zebin).unwrap();
    let add = program.kernel("add_k").unwrap();
    let x = device.upload(&[5u32; 64]).unwrap();
    // SAFETY: add_k touches x[0..64).
    unsafe {
        add.launch(LaunchDims::linear(1, 64))
            .args_raw(&[
                KernelArg::I32(64),
                KernelArg::U32(3),
                KernelArg::Ptr(x.ptr()),
            ])
            .unchecked()
            .run()
    }
    .unwrap();
    assert_eq!(x.to_vec().unwrap(), vec![8u32; 64]);
    // Without SPIR-V to read, the driver's parameter count still refuses a short launch.
    // SAFETY: refused before anything runs.
    let e = unsafe {
        add.launch(LaunchDims::linear(1, 64))
            .args_raw(&[KernelArg::I32(64), KernelArg::U32(3)])
            .unchecked()
            .run()
    }
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("takes 3 argument(s); the launch passes 2"),
        "{e}"
    );
    drop((x, add, program));
    drop(rt);
    let lines = log_lines(&log);
    assert!(
        lines
            .iter()
            .any(|l| l == "module native 1864 2" || l.starts_with("module native")),
        "{lines:#?}"
    );
    assert_contracts_kept(&lines, "zebin");
}

#[test]
fn a_native_binary_s_local_parameters_come_from_its_ze_info() {
    // A zebin carries no SPIR-V to read: which parameters are `__local` pointers (a size for
    // the driver, no value) is said by its .ze_info; passing the size as a value would give
    // the kernel a 4-byte local buffer.
    let ze_info = "version: '1.11'\nkernels:\n  - name: reverse\n    payload_arguments:\n      \
                   - arg_type: arg_bypointer\n        arg_index: 0\n        addrspace: global\n      \
                   - arg_type: arg_bypointer\n        arg_index: 1\n        addrspace: global\n      \
                   - arg_type: arg_bypointer\n        arg_index: 2\n        addrmode: slm\n        \
                   addrspace: local\n";
    let log = log_file("zebin-local");
    let rt = in_process(&log, &[]);
    let device = rt.device("level-zero", 0).unwrap();
    let program = offload_tests::load(
        &device,
        &synthetic_zebin(&[("reverse", 3, 0b100)], Some(ze_info)),
    )
    .unwrap();
    let k = program.kernel("reverse").unwrap();
    let launch = |local: KernelArg| run_reverse(&device, &k, (4, 64), local, 0);
    launch(KernelArg::U32(64 * 4)).unwrap();
    let e = launch(KernelArg::U32(0)).unwrap_err().to_string();
    assert!(
        e.contains("argument 2 is a `__local` pointer") && e.contains("the launch passes 0"),
        "{e}"
    );
    drop((k, program));
    drop(rt);
    let lines = log_lines(&log);
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("launch reverse") && l.ends_with(",local:256")),
        "{lines:#?}"
    );
    assert_contracts_kept(&lines, "zebin local parameters");
}

#[test]
fn wrong_arguments_and_group_sizes_are_refused_before_the_driver_sees_them() {
    let log = log_file("refusals");
    let rt = in_process(&log, &[]);
    let device = rt.device("level-zero", 0).unwrap();
    let program = offload_tests::load(&device, &spirv("saxpy")).unwrap();
    let k = program.kernel("saxpy").unwrap();
    let y = device.alloc::<f32>(64).unwrap();
    let dims = LaunchDims::linear(1, 64);
    let cases: [(Vec<KernelArg>, &str); 3] = [
        (vec![KernelArg::I32(64)], "takes 4 argument(s)"),
        (
            vec![
                KernelArg::F32(64.0),
                KernelArg::F32(1.0),
                KernelArg::Ptr(y.ptr()),
                KernelArg::Ptr(y.ptr()),
            ],
            "argument 0 is i32",
        ),
        (
            vec![
                KernelArg::I32(64),
                KernelArg::F64(1.0),
                KernelArg::Ptr(y.ptr()),
                KernelArg::Ptr(y.ptr()),
            ],
            "argument 1 is float",
        ),
    ];
    for (args, says) in cases {
        // SAFETY: refused before anything runs.
        let e = unsafe { k.launch(dims).args_raw(&args).unchecked().run() }
            .unwrap_err()
            .to_string();
        assert!(e.contains(says), "want '{says}': {e}");
    }
    // A GLCompute module has no kernel; a name that is not an entry point lists the kernels.
    let e = offload_tests::load(&device, &spirv("compute"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("no kernel"), "{e}");
    let e = program.kernel("saxpy2").unwrap_err().to_string();
    assert!(e.contains("its kernels: saxpy"), "{e}");
    drop((y, k, program));
    drop(rt);
    let lines = log_lines(&log);
    assert!(!lines.iter().any(|l| l.starts_with("launch")), "{lines:#?}");
    assert!(
        !lines.iter().any(|l| l.starts_with("arg-refused")),
        "{lines:#?}"
    );
    assert_contracts_kept(&lines, "refusals");
}

#[test]
fn build_failures_carry_the_driver_s_log_and_faults_lose_the_device() {
    let log = log_file("errors");
    // A 3 MB build log (warnings after the error): read whole, its first 16 KiB in the error,
    // after the status.
    let rt = in_process(&log, &[("FAKE_ZE_BUILD_LOG_BYTES", "3000000")]);
    let device = rt.device("level-zero", 0).unwrap();
    let text = std::fs::read_to_string(repo_root().join("tests/spirv/fault.spvasm"))
        .unwrap()
        .replace("\"fault\"", "\"does_not_build\"");
    let e =
        offload_tests::load(&device, &spirv_from_text("does-not-build", &text, true)).unwrap_err();
    assert!(matches!(e, offload::Error::InvalidImage(_)), "{e:?}");
    let m = e.to_string();
    assert!(m.contains("ZE_RESULT_ERROR_MODULE_BUILD_FAILURE"), "{m}");
    assert!(m.contains("undefined function 'no_such_builtin'"), "{m}");
    assert!(
        m.len() < 20_000 && m.ends_with(&format!("... ({} bytes more)", 3_000_000 - (16 << 10))),
        "{} bytes: ...{}",
        m.len(),
        &m[m.len().saturating_sub(80)..]
    );
    // A kernel that faults: the wait reports the lost device, and so does the next one.
    let program = offload_tests::load(&device, &spirv("fault")).unwrap();
    let k = program.kernel("fault").unwrap();
    // SAFETY: the kernel's write faults on the (fake) GPU, which is what is tested.
    let e = unsafe {
        k.launch(LaunchDims::linear(1, 1))
            .args_raw(&[KernelArg::I32(0)])
            .unchecked()
            .run()
    }
    .unwrap_err();
    assert!(matches!(e, offload::Error::DeviceFailure(_)), "{e:?}");
    assert!(e.to_string().contains("ZE_RESULT_ERROR_DEVICE_LOST"), "{e}");
    let x = device.upload(&[1u32; 16]);
    let read = x.and_then(|b| b.to_vec());
    assert!(read.is_err(), "the device is lost: {read:?}");
    drop((k, program));
    drop(rt);
}

#[test]
fn memory_kinds_work_as_kernel_arguments_and_out_of_memory_names_the_call() {
    let log = log_file("memory");
    let rt = in_process(&log, &[("FAKE_ZE_MEMORY", "1048576")]);
    let device = rt.device("level-zero", 0).unwrap();
    let program = offload_tests::load(&device, &spirv("add_k")).unwrap();
    let add = program.kernel("add_k").unwrap();
    for kind in ["host", "shared"] {
        let mut buf = if kind == "host" {
            device.alloc_host::<u32>(256).unwrap()
        } else {
            device.alloc_shared::<u32>(256).unwrap()
        };
        for (i, v) in buf.as_mut_slice().unwrap().iter_mut().enumerate() {
            *v = i as u32;
        }
        // SAFETY: add_k touches buf[0..256).
        unsafe {
            add.launch(LaunchDims::linear(1, 256))
                .arg(256i32)
                .arg(9u32)
                .arg(&mut buf)
                .unchecked()
                .run()
        }
        .unwrap();
        let got = buf.as_slice().unwrap();
        assert!((0..256).all(|i| got[i] == i as u32 + 9), "{kind}");
    }
    let e = device.alloc::<u8>(4 << 20).unwrap_err();
    assert!(matches!(e, offload::Error::OutOfMemory(_)), "{e:?}");
    assert!(e.to_string().contains("zeMemAllocDevice"), "{e}");
    // Above the device's largest single allocation (the fake says 4 GiB): refused with both
    // numbers before the driver sees it.
    let e = device.alloc::<u8>((4 << 30) + 1).unwrap_err();
    assert!(matches!(e, offload::Error::OutOfMemory(_)), "{e:?}");
    assert!(
        e.to_string().contains("4294967297 bytes in one allocation")
            && e.to_string()
                .contains("at most 4294967296 bytes at once (maxMemAllocSize)"),
        "{e}"
    );
    drop((add, program));
    drop(rt);
    assert_contracts_kept(&log_lines(&log), "memory");
}

#[test]
fn a_kernel_s_parameter_record_is_a_global_of_its_module_and_checks_launches() {
    // add_k.spvasm carries the OFFLOAD_PARAMS record as a compiler writes it: an exported global
    // of the parameter list's text, which the driver gives by name.
    let log = log_file("record");
    let rt = in_process(&log, &[]);
    let device = rt.device("level-zero", 0).unwrap();
    let program = offload_tests::load(&device, &spirv("add_k")).unwrap();
    let text = String::from_utf8(
        program
            .global::<u8>("__offload_params_add_k")
            .unwrap()
            .to_vec()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(text, "int n, unsigned k, unsigned x[n]\0");
    let add = program.kernel("add_k").unwrap();
    assert!(matches!(add.params(), Some(Ok(_))), "{:?}", add.params());
    let mut x = device.upload(&[1u32; 100]).unwrap();
    add.launch(LaunchDims::linear(1, 128))
        .arg(100)
        .arg(4u32)
        .arg(&mut x)
        .run()
        .unwrap();
    assert_eq!(x.to_vec().unwrap(), vec![5u32; 100]);
    // n past the buffer: refused by the record, before the driver.
    let e = add
        .launch(LaunchDims::linear(1, 128))
        .arg(101)
        .arg(4u32)
        .arg(&mut x)
        .run()
        .unwrap_err()
        .to_string();
    assert!(e.contains("x"), "{e}");
    drop((x, add, program));
    drop(rt);
    let lines = log_lines(&log);
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.starts_with("launch add_k"))
            .count(),
        1,
        "{lines:#?}"
    );
    assert_contracts_kept(&lines, "record");
}

#[test]
fn the_gpu_check_runs_end_to_end_against_the_fake_driver() {
    // The script and the check binary as they will run on an Intel GPU machine, with the fake
    // driver behind the real loader: the fake computes every kernel the check runs, so every
    // result is compared. With failing allocations the check fails, through the pipe.
    let mut wants = vec![
        "saxpy from SPIR-V",
        "reverse through __local memory and a barrier (4096 groups of 256)",
    ];
    wants.extend(GPU_CHECK_EXTRAS);
    let run = assert_gpu_check_dry_run("level-zero", &wants, Some(("FAKE_ZE_MEMORY", "4096")));
    assert_eq!(run.summary["not_compared"], 0, "{}", run.summary);
}

#[test]
fn a_container_gives_the_gpu_its_spirv_entry() {
    // An offload binary with a host image and a SPIR-V module: routed to the Level Zero GPU,
    // which loads the SPIR-V entry; a container with only the host image is not for it.
    use offload_core::image::container::{PackImage, offload_binary};
    let log = log_file("container");
    let rt = in_process(&log, &[]);
    let device = rt.device("level-zero", 0).unwrap();
    let spv = spirv("add_k");
    let host = std::fs::read(host_kernel("add_k")).unwrap();
    let both = offload_binary(&[
        PackImage {
            bytes: &host,
            triple: "x86_64-unknown-linux-gnu",
            arch: "",
        },
        PackImage {
            bytes: &spv,
            triple: "spirv64-unknown-unknown",
            arch: "",
        },
    ]);
    let program = offload_tests::load(&device, &both).unwrap();
    let add = program.kernel("add_k").unwrap();
    let mut x = device.upload(&[2u32; 32]).unwrap();
    add.launch(LaunchDims::linear(1, 32))
        .arg(32)
        .arg(1u32)
        .arg(&mut x)
        .run()
        .unwrap();
    assert_eq!(x.to_vec().unwrap(), vec![3u32; 32]);
    let host_only = offload_binary(&[PackImage {
        bytes: &host,
        triple: "x86_64-unknown-linux-gnu",
        arch: "",
    }]);
    let e = offload_tests::load(&device, &host_only)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("none fits level-zero:0") && e.contains("for another target"),
        "{e}"
    );
    drop((x, add, program));
    drop(rt);
    assert_contracts_kept(&log_lines(&log), "container");
}

#[test]
fn kernel_limits_structs_by_value_and_unreadable_entry_points_are_refused_with_the_reason() {
    let log = log_file("kernel-limits");
    let rt = in_process(&log, &[]);
    let device = rt.device("level-zero", 0).unwrap();
    // The driver says `heavy` runs at most 16 sub-groups of 16 work items.
    let text = std::fs::read_to_string(repo_root().join("tests/spirv/saxpy.spvasm"))
        .unwrap()
        .replace("\"saxpy\"", "\"heavy\"");
    let program = offload_tests::load(&device, &spirv_from_text("heavy", &text, true)).unwrap();
    let k = program.kernel("heavy").unwrap();
    let y = device.alloc::<f32>(512).unwrap();
    let args = [
        KernelArg::I32(512),
        KernelArg::F32(1.0),
        KernelArg::Ptr(y.ptr()),
        KernelArg::Ptr(y.ptr()),
    ];
    // SAFETY: refused before anything runs.
    let e = unsafe {
        k.launch(LaunchDims::linear(1, 512))
            .args_raw(&args)
            .unchecked()
            .run()
    }
    .unwrap_err()
    .to_string();
    assert!(e.contains("runs at most 256 threads per block"), "{e}");
    assert!(e.contains("maxNumSubgroups x maxSubgroupSize"), "{e}");
    // SAFETY: y holds the 512 floats the kernel touches.
    unsafe {
        k.launch(LaunchDims::linear(2, 256))
            .args_raw(&args)
            .unchecked()
            .run()
    }
    .unwrap();
    // A struct passed by value (a Function-storage pointer parameter, as llvm-spirv writes
    // one): not a pointer the launch may pass.
    let by_value = "OpCapability Addresses\nOpCapability Kernel\nOpCapability Int64\n\
        OpMemoryModel Physical64 OpenCL\nOpEntryPoint Kernel %k \"takes_struct\"\n\
        OpDecorate %s FuncParamAttr ByVal\n\
        %uint = OpTypeInt 32 0\n%void = OpTypeVoid\n%S = OpTypeStruct %uint %uint %uint\n\
        %ptr_s = OpTypePointer Function %S\n%fnty = OpTypeFunction %void %ptr_s\n\
        %k = OpFunction %void None %fnty\n%s = OpFunctionParameter %ptr_s\n\
        %entry = OpLabel\nOpReturn\nOpFunctionEnd\n";
    let program2 =
        offload_tests::load(&device, &spirv_from_text("by-value", by_value, true)).unwrap();
    let k2 = program2.kernel("takes_struct").unwrap();
    // SAFETY: refused before anything runs.
    let e = unsafe {
        k2.launch(LaunchDims::linear(1, 1))
            .args_raw(&[KernelArg::Ptr(y.ptr())])
            .unchecked()
            .run()
    }
    .unwrap_err()
    .to_string();
    assert!(e.contains("a struct passed by value"), "{e}");
    // An entry point whose id is no function: its parameters cannot be read, so no launch
    // could be checked: refused at the lookup.
    let mut words: Vec<u32> = spirv("saxpy")
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect();
    let at = (5..words.len())
        .find(|&i| words[i] & 0xffff == 15)
        .expect("an OpEntryPoint");
    // The function id becomes the id of the first type declared (OpTypeInt's result).
    let int_at = (5..words.len()).find(|&i| words[i] & 0xffff == 21).unwrap();
    words[at + 2] = words[int_at + 1];
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let program3 = offload_tests::load(&device, &bytes).unwrap();
    let e = program3.kernel("saxpy").unwrap_err().to_string();
    assert!(e.contains("names no function"), "{e}");
    drop((y, k, k2, program, program2, program3));
    drop(rt);
    assert_contracts_kept(&log_lines(&log), "kernel limits");
}

#[test]
fn the_gpus_of_one_driver_share_its_context() {
    // Memory of one device used by a kernel on the other: both are the driver's, in one
    // context, as Level Zero requires (the fake says "wrong-context" otherwise).
    let log = log_file("two-devices");
    let rt = in_process(&log, &[("FAKE_ZE_DEVICES", "2")]);
    let (d0, d1) = (
        rt.device("level-zero", 0).unwrap(),
        rt.device("level-zero", 1).unwrap(),
    );
    let x = d0.upload(&[1u32; 64]).unwrap();
    let program = offload_tests::load(&d1, &spirv("add_k")).unwrap();
    let add = program.kernel("add_k").unwrap();
    // SAFETY: add_k touches x[0..64); device 0's memory is reachable in the shared context.
    unsafe {
        add.launch(LaunchDims::linear(1, 64))
            .args_raw(&[
                KernelArg::I32(64),
                KernelArg::U32(6),
                KernelArg::Ptr(x.ptr()),
            ])
            .unchecked()
            .run()
    }
    .unwrap();
    assert_eq!(x.to_vec().unwrap(), vec![7u32; 64]);
    drop((x, add, program, d0, d1));
    drop(rt);
    let lines = log_lines(&log);
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.starts_with("context-create"))
            .count(),
        1,
        "{lines:#?}"
    );
    assert_contracts_kept(&lines, "two devices");
}

/// An add_k launch, queued or not, on the fake driver that `env` makes fail ([`fail_a_launch`]),
/// and the driver's log.
fn add_k_failure(tag: &str, env: (&str, &str), queued: bool) -> (LaunchFailure, Vec<String>) {
    let log = log_file(tag);
    let rt = in_process(&log, &[env, ("FAKE_ZE_DELAY_US", "20000")]);
    let device = rt.device("level-zero", 0).unwrap();
    let program = offload_tests::load(&device, &spirv("add_k")).unwrap();
    let add = program.kernel("add_k").unwrap();
    let failure = fail_a_launch(&device, &add, queued);
    drop((add, program, device, rt));
    (failure, log_lines(&log))
}

#[test]
fn a_wait_that_gives_up_quarantines_the_memory_of_the_work_and_fails_the_device() {
    // The host wait after the launch returns ZE_RESULT_ERROR_UNKNOWN at once: the work still
    // runs 20 ms later, so its buffer must never be freed, and the device takes no more.
    let (failure, lines) = add_k_failure(
        "wait-gives-up",
        ("FAKE_ZE_SYNC_GIVES_UP", "add_k:0x7ffffffe"),
        true,
    );
    assert!(
        lines.iter().any(|l| l == "event-sync-gives-up 0x7ffffffe"),
        "{lines:#?}"
    );
    assert_launch_failure(&failure, true, &lines);
}

#[test]
fn a_copy_to_the_host_whose_wait_gives_up_can_write_its_staging_memory_only() {
    hung_copy_to_the_host("copy-hangs", HungRead::Pageable);
}

#[test]
fn a_queued_copy_to_lent_host_memory_whose_wait_gives_up_cannot_write_it_either() {
    hung_copy_to_the_host("queued-copy-hangs", HungRead::PageableQueued);
}

#[test]
fn a_copy_to_pinned_host_memory_whose_wait_gives_up_cannot_write_it_either() {
    // A HostBuffer of the device, which the program has as a slice: staged too.
    hung_copy_to_the_host("pinned-copy-hangs", HungRead::Pinned);
}

/// A read whose copy hangs and whose wait gives up (FAKE_ZE_COPY_HANGS), [`hung_read`].
fn hung_copy_to_the_host(tag: &str, how: HungRead) {
    let log = log_file(tag);
    let rt = in_process(&log, &[("FAKE_ZE_COPY_HANGS", "4000")]);
    let device = rt.device("level-zero", 0).unwrap();
    hung_read(
        &device,
        &fake_ze_driver(),
        "fake_ze_finish_held_copies",
        how,
        &log,
    );
    let lines = log_lines(&log);
    assert!(
        lines.iter().any(|l| l == "event-sync-gives-up 0x1"),
        "{lines:#?}"
    );
}

#[test]
fn copies_to_the_host_are_staged_in_chunks_and_queued_ones_wait() {
    // A copy to the host fills a host allocation, which the CPU copies out of after a drain;
    // a longer one than the staging allocation (64 MiB) goes in chunks, and every byte
    // arrives; on a queue too, after the queue's earlier work, into pinned memory too.
    let log = log_file("staged-reads");
    let rt = in_process(&log, &[]);
    let device = rt.device("level-zero", 0).unwrap();
    let n = (64 << 20) / 4 + 3000;
    let v: Vec<u32> = (0..n as u32).map(|i| i.wrapping_mul(2654435761)).collect();
    let dbuf = device.upload(&v).unwrap();
    let mut back = vec![0u32; n];
    dbuf.read(&mut back).unwrap();
    assert!(
        back == v,
        "the chunked copy to the host lost or moved bytes"
    );
    let queue = device.queue().unwrap();
    let mut part = vec![0u32; 1000];
    let mut pinned = device.alloc_host::<u32>(1000).unwrap();
    queue
        .scope(|s| {
            s.read(&mut part, dbuf.slice(1000..2000)?)?;
            s.read(pinned.as_mut_slice()?, dbuf.slice(1000..2000)?)
        })
        .unwrap();
    assert_eq!(part, v[1000..2000]);
    assert_eq!(pinned.as_slice().unwrap(), &v[1000..2000]);
    let pinned_at = pinned.as_slice().unwrap().as_ptr() as u64;
    drop((pinned, dbuf, queue, device, rt));
    let lines = log_lines(&log);
    // Host allocations (kind 2) of `bytes`, other than the program's own pinned buffer: the
    // staging ones, each freed once.
    let staging = |bytes: usize| -> Vec<u64> {
        lines
            .iter()
            .filter_map(|l| {
                let rest = l.strip_prefix("alloc 2 0x")?;
                let (at, size) = rest.split_once(' ')?;
                let at = u64::from_str_radix(at, 16).ok()?;
                (size == bytes.to_string() && at != pinned_at).then_some(at)
            })
            .collect()
    };
    let chunked = staging(64 << 20);
    assert_eq!(chunked.len(), 1, "{lines:#?}");
    assert_eq!(frees_of(&lines, chunked[0]), 1, "{lines:#?}");
    let chunk = lines
        .iter()
        .position(|l| *l == format!("copy {}", 64 << 20));
    let rest = lines.iter().position(|l| l == "copy 12000");
    assert!(
        matches!((chunk, rest), (Some(a), Some(b)) if a < b),
        "{lines:#?}"
    );
    // The queued reads into `part` and into the pinned buffer (which the program has as a
    // slice too): each staged.
    let queued = staging(4000);
    assert_eq!(queued.len(), 2, "{lines:#?}");
    for at in queued {
        assert_eq!(frees_of(&lines, at), 1, "{lines:#?}");
    }
    assert_contracts_kept(&lines, "staged copies to the host");
}

#[test]
fn a_lost_device_is_settled_and_the_memory_of_its_work_is_freed() {
    let (failure, lines) = add_k_failure("lost-settled", ("FAKE_ZE_FAULT", "add_k"), true);
    assert!(lines.iter().any(|l| l == "device-lost add_k"), "{lines:#?}");
    assert_launch_failure(&failure, false, &lines);
}

#[test]
fn a_synchronous_launch_whose_wait_gives_up_quarantines_its_memory_too() {
    let (failure, lines) = add_k_failure(
        "sync-launch-gives-up",
        ("FAKE_ZE_SYNC_GIVES_UP", "add_k:0x7ffffffe"),
        false,
    );
    assert!(
        lines.iter().any(|l| l == "event-sync-gives-up 0x7ffffffe"),
        "{lines:#?}"
    );
    assert_launch_failure(&failure, true, &lines);
}
