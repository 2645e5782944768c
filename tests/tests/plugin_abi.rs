//! The plugin ABI as the runtime sees it: a new backend crate (testdev) is found through
//! OFFLOAD_PLUGIN_PATH, loaded and routed to; damaged tables, panicking constructors and
//! failing initialisation are reported with their reason while the other plugins keep working.

use offload::{Error, KernelArg, LaunchDims, Runtime};
use offload_abi::loader::check_table;
use offload_abi::{ABI_MAGIC, ABI_MAJOR, ABI_MINOR, PluginTable};
use offload_tests::*;

const TESTDEV_MACHINE: u16 = 0x7E57;

fn both_runtime() -> Runtime {
    Runtime::with_plugin_dirs(&[testdev_plugin_dir(), host_plugin_dir()], None)
}

fn info_json(envs: &[(&str, &str)]) -> serde_json::Value {
    let dir = testdev_plugin_dir();
    let mut all = vec![("OFFLOAD_PLUGIN_PATH", dir.to_str().unwrap())];
    all.extend_from_slice(envs);
    let out = offload(&["info", "--json"], &all);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_str(&stdout(&out)).unwrap()
}

fn plugin<'a>(json: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    json["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("plugin {name} missing from {json}"))
}

#[test]
fn info_lists_the_test_backend_only_when_its_directory_is_on_the_path() {
    let out = offload(&["info", "--json"], &[]);
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let names: Vec<&str> = json["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"host"), "{names:?}");
    assert!(!names.contains(&"testdev"), "{names:?}");
    let host = plugin(&json, "host");
    assert_eq!(host["status"], "ok");
    assert!(
        !host["devices"][0]["compute_unit"]
            .as_str()
            .unwrap()
            .is_empty()
    );

    let json = info_json(&[]);
    let t = plugin(&json, "testdev");
    assert_eq!(t["status"], "ok");
    assert_eq!(t["abi_version"], format!("{ABI_MAJOR}.{ABI_MINOR}"));
    assert_eq!(t["elf_machine"], TESTDEV_MACHINE);
    assert_eq!(t["devices"].as_array().unwrap().len(), 2);
    assert_eq!(t["devices"][1]["compute_unit"], "test1");
    assert_eq!(plugin(&json, "host")["status"], "ok");

    let text = offload(
        &["info"],
        &[(
            "OFFLOAD_PLUGIN_PATH",
            testdev_plugin_dir().to_str().unwrap(),
        )],
    );
    assert!(
        stdout(&text).contains("testdev:1  testdev virtual device 1"),
        "{}",
        stdout(&text)
    );
}

#[test]
fn offload_plugins_restricts_what_is_loaded() {
    let json = info_json(&[("OFFLOAD_PLUGINS", "testdev")]);
    let names: Vec<&str> = json["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["testdev"]);
    // A name no plugin file has is an error naming the variable, for every command.
    let so = host_kernel("saxpy");
    for args in [
        &["info"][..],
        &["run", so.to_str().unwrap(), "--kernel", "k"][..],
    ] {
        let out = offload(
            args,
            &[
                ("OFFLOAD_PLUGINS", "host,nonesuch"),
                (
                    "OFFLOAD_PLUGIN_PATH",
                    testdev_plugin_dir().to_str().unwrap(),
                ),
            ],
        );
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains("OFFLOAD_PLUGINS='host,nonesuch' names plugin 'nonesuch'"),
            "{err}"
        );
    }
}

#[test]
fn images_for_the_new_backend_are_routed_to_it() {
    let rt = both_runtime();
    let image = synthetic_elf(TESTDEV_MACHINE, &["fill", "panic"]);
    let device = rt.route(&image).unwrap();
    assert_eq!(device.to_string(), "testdev:0");
    let program = offload_tests::load(&device, &image).unwrap();
    let k = program.kernel("fill").unwrap();
    let buf = device.alloc_buffer(4 * 12).unwrap();
    // SAFETY: the buffers are as long as the kernel touches for these arguments.
    unsafe {
        k.launch(LaunchDims {
            grid: [2, 1, 1],
            block: [3, 2, 1],
            shared_mem_bytes: 0,
        })
        .args_raw(&[KernelArg::U32(100), KernelArg::Ptr(buf.ptr())])
        .unchecked()
        .run()
    }
    .unwrap();
    let mut raw = vec![0u8; 48];
    buf.read(&mut raw).unwrap();
    let got: Vec<u32> = raw
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(got, (100..112).collect::<Vec<u32>>());

    // A host image in the same runtime still goes to the host plugin.
    let host = std::fs::read(host_kernel("saxpy")).unwrap();
    assert_eq!(rt.route(&host).unwrap().to_string(), "host:0");

    // A panic inside a plugin call is an error; the process and the plugin survive.
    let p = program.kernel("panic").unwrap();
    // SAFETY: the layer refuses this launch before the kernel runs (what the test checks).
    let e = unsafe { p.launch(LaunchDims::linear(1, 1)).unchecked().run() }.unwrap_err();
    assert!(matches!(e, Error::PluginPanic(_)), "{e:?}");
    assert!(
        e.to_string()
            .contains("testdev kernel 'panic' was launched"),
        "{e}"
    );
    // SAFETY: the buffers are as long as the kernel touches for these arguments.
    unsafe {
        k.launch(LaunchDims::linear(1, 1))
            .args_raw(&[KernelArg::Ptr(buf.ptr())])
            .unchecked()
            .run()
    }
    .unwrap();

    // Through the command as well.
    let dir = scratch("testdev-run");
    let path = dir.join("img.elf");
    std::fs::write(&path, &image).unwrap();
    let out = offload(
        &[
            "run",
            path.to_str().unwrap(),
            "--kernel",
            "fill",
            "--grid",
            "2",
            "--block",
            "4",
            "--arg",
            "u32:7",
            "--arg",
            "buf:u32:8",
            "--json",
        ],
        &[(
            "OFFLOAD_PLUGIN_PATH",
            testdev_plugin_dir().to_str().unwrap(),
        )],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(json["device"], "testdev:0");
    assert_eq!(
        json["buffers"][0]["head"],
        serde_json::json!([7, 8, 9, 10, 11, 12, 13, 14])
    );
}

#[test]
fn damaged_plugins_are_reported_and_the_others_keep_working() {
    let bad_major = format!(
        "plugin speaks ABI {}.{ABI_MINOR}, this runtime speaks {ABI_MAJOR}.{ABI_MINOR}",
        ABI_MAJOR + 1
    );
    let cases = [
        ("bad-magic", "failed", "table magic is"),
        ("bad-major", "failed", bad_major.as_str()),
        ("short-table", "failed", "plugin table is 64 bytes"),
        ("null-entry", "failed", "returned null"),
        ("null-launch", "failed", "has a null 'launch' entry"),
        ("null-jit-stats", "failed", "has a null 'jit_stats' entry"),
        (
            "panic-entry",
            "failed",
            "the plugin's constructor panicked: testdev constructor panics",
        ),
        ("init-error", "failed", "driver error 999"),
        (
            "huge-init-error",
            "failed",
            "xxx ... (the plugin's message was cut: 102400 bytes)",
        ),
        ("no-devices", "no-devices", "reports 0 devices"),
    ];
    for (mode, status, reason) in cases {
        let json = info_json(&[("OFFLOAD_TESTDEV_MODE", mode)]);
        let t = plugin(&json, "testdev");
        assert_eq!(t["status"], status, "{mode}: {t}");
        assert!(
            t["reason"].as_str().unwrap().contains(reason),
            "{mode}: {t}"
        );
        assert_eq!(
            plugin(&json, "host")["status"],
            "ok",
            "{mode}: host must keep working"
        );
    }
    // A run on the host plugin works while a damaged plugin sits on the path.
    let so = host_kernel("saxpy");
    let out = offload(
        &[
            "run",
            so.to_str().unwrap(),
            "--kernel",
            "saxpy",
            "--arg",
            "i32:1",
            "--arg",
            "f32:2",
            "--arg",
            "buf:f32:1:fill=3",
            "--arg",
            "buf:f32:1:fill=4",
            "--json",
        ],
        &[
            (
                "OFFLOAD_PLUGIN_PATH",
                testdev_plugin_dir().to_str().unwrap(),
            ),
            ("OFFLOAD_TESTDEV_MODE", "bad-major"),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(json["buffers"][1]["head"][0], 10.0);
}

/// Word arguments (OpenMP's convention, ABI 1.4) reach a 1.4 plugin as 8 bytes, and a plugin
/// that speaks 1.3 gets a clear error instead of an argument kind it cannot decode. Sets
/// `OFFLOAD_TESTDEV_MODE` in this process: a process per test (nextest) keeps it here.
#[test]
fn word_arguments_go_only_to_plugins_that_speak_abi_1_4() {
    let image = synthetic_elf(TESTDEV_MACHINE, &["fill"]);
    let fill = |rt: &Runtime| {
        let device = rt.route(&image).unwrap();
        let program = offload_tests::load(&device, &image).unwrap();
        let k = program.kernel("fill").unwrap();
        let buf = device.alloc_buffer(16).unwrap();
        // SAFETY: the testdev plugin's fill kernel writes 4 u32s into the 16-byte buffer (or refuses words).
        let r = unsafe {
            k.launch(LaunchDims::linear(1, 4))
                .args_raw(&[KernelArg::U32(7), KernelArg::Word(buf.ptr().0)])
                .unchecked()
                .run()
        };
        let mut raw = vec![0u8; 16];
        buf.read(&mut raw).unwrap();
        (r, raw)
    };
    let (r, raw) = fill(&both_runtime());
    r.unwrap();
    assert_eq!(raw[..4], 7u32.to_le_bytes());
    assert_eq!(raw[12..], 10u32.to_le_bytes());
    // SAFETY: no other thread of this test process reads the environment now.
    unsafe { std::env::set_var("OFFLOAD_TESTDEV_MODE", "abi-1.3") };
    let rt = Runtime::with_plugin_dirs(&[testdev_plugin_dir()], None);
    let (r, raw) = fill(&rt);
    let e = r.unwrap_err();
    assert!(matches!(e, Error::Unsupported(_)), "{e:?}");
    assert!(
        e.to_string()
            .contains("kernel argument 1 is a word (OpenMP's convention, plugin ABI 1.4); plugin 'testdev' speaks ABI 1.3"),
        "{e}"
    );
    assert_eq!(raw, vec![0u8; 16]);
    // Nor event timing (ABI 1.5): its events work, timing them is refused by name.
    let device = rt.device("testdev", 0).unwrap();
    let q = device.queue().unwrap();
    let (a, b) = (q.record().unwrap(), q.record().unwrap());
    b.synchronize().unwrap();
    let e = b.elapsed_since(&a).unwrap_err().to_string();
    assert!(
        e.contains("plugin 'testdev' has no 'event_elapsed' entry (it speaks an older ABI)"),
        "{e}"
    );
    // Nor host access (ABI 1.6): refused by name, the visit never called.
    let buf = device.alloc_buffer(16).unwrap();
    // SAFETY: the visit touches nothing.
    let e = unsafe {
        offload::raw::device(&device).host_access(buf.ptr(), 16, &mut |_| {
            panic!("visited through a 1.3 table")
        })
    }
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("plugin 'testdev' has no 'host_access' entry (it speaks an older ABI)"),
        "{e}"
    );
}

#[test]
fn host_access_visits_device_memory_in_range_and_carries_the_visits_error_and_panic() {
    let rt = both_runtime();
    for plugin in ["testdev", "host"] {
        let device = rt.device(plugin, 0).unwrap();
        // SAFETY: the calls below keep the raw device's promises (each says how).
        let raw = unsafe { offload::raw::device(&device) }.clone();
        let buf = device.alloc_buffer(64).unwrap();
        buf.write(&[1u8; 64]).unwrap();
        // A visit of bytes 8..40 writes them; the rest stay as they were.
        let mut seen = Vec::new();
        // SAFETY: the visit writes the 32 bytes it is given, and keeps no pointer.
        unsafe {
            raw.host_access(buf.ptr().offset(8).unwrap(), 32, &mut |at| {
                let bytes = std::slice::from_raw_parts_mut(at, 32);
                seen.extend_from_slice(bytes);
                for (i, b) in bytes.iter_mut().enumerate() {
                    *b = i as u8 + 100;
                }
                Ok(())
            })
        }
        .unwrap();
        assert_eq!(
            seen,
            vec![1u8; 32],
            "{plugin}: the visit saw the device's bytes"
        );
        let mut back = vec![0u8; 64];
        buf.read(&mut back).unwrap();
        let want: Vec<u8> = (0..64)
            .map(|i| {
                if (8..40).contains(&i) {
                    i as u8 - 8 + 100
                } else {
                    1
                }
            })
            .collect();
        assert_eq!(back, want, "{plugin}: the visit's writes, and only those");
        // A range past the allocation, and a null pointer, are refused; the visit is not run.
        for (ptr, len) in [
            (buf.ptr().offset(8).unwrap(), 57),
            (offload::DevicePtr(0), 1),
        ] {
            // SAFETY: never visited.
            let e = unsafe { raw.host_access(ptr, len, &mut |_| panic!("visited")) }.unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{plugin}: {e:?}");
        }
        // The visit's error is the call's, and so is its panic (resumed once the plugin
        // returned).
        // SAFETY: the visits touch nothing.
        let e = unsafe {
            raw.host_access(buf.ptr(), 64, &mut |_| {
                Err(Error::DeviceFailure("the visit's own error".into()))
            })
        }
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "device failure: the visit's own error",
            "{plugin}"
        );
        // SAFETY: the visit touches nothing.
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe {
            raw.host_access(buf.ptr(), 64, &mut |_| panic!("the visit's own panic"))
        }))
        .unwrap_err();
        assert_eq!(
            panicked.downcast_ref::<&str>(),
            Some(&"the visit's own panic")
        );
        // The device works on after both.
        buf.write(&[3u8; 64]).unwrap();
        buf.read(&mut back).unwrap();
        assert_eq!(back, vec![3u8; 64], "{plugin}");
    }
}

#[test]
fn genuinely_shorter_older_tables_load_and_work() {
    // testdev builds these tables at the very end of a readable page, followed by one that
    // cannot be read: a runtime that read past the size an older table declares would fault
    // here. They load, their devices work, and the entries they lack are simply absent.
    for (mode, minor) in [("abi-1.0", 0), ("abi-1.1", 1)] {
        let json = info_json(&[("OFFLOAD_TESTDEV_MODE", mode)]);
        let t = plugin(&json, "testdev");
        assert_eq!(t["status"], "ok", "{mode}: {t}");
        assert_eq!(t["abi_version"], format!("{ABI_MAJOR}.{minor}"));
        assert!(t["jit"].is_null(), "{mode}: {t}");
        assert_eq!(t["devices"].as_array().unwrap().len(), 2);
        // Real work through the short table, in a process of its own.
        let dir = scratch(&format!("short-{mode}"));
        let path = dir.join("img.elf");
        std::fs::write(&path, synthetic_elf(TESTDEV_MACHINE, &["fill"])).unwrap();
        let out = offload(
            &[
                "run",
                path.to_str().unwrap(),
                "--kernel",
                "fill",
                "--block",
                "4",
                "--arg",
                "u32:5",
                "--arg",
                "buf:u32:4",
                "--json",
            ],
            &[
                (
                    "OFFLOAD_PLUGIN_PATH",
                    testdev_plugin_dir().to_str().unwrap(),
                ),
                ("OFFLOAD_TESTDEV_MODE", mode),
            ],
        );
        assert!(out.status.success(), "{mode}: {}", stderr(&out));
        let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
        assert_eq!(
            json["buffers"][0]["head"],
            serde_json::json!([5, 6, 7, 8]),
            "{mode}"
        );
    }
    // The host plugin of this build has every entry.
    let json = info_json(&[]);
    assert!(plugin(&json, "host")["jit"]["compiles"].is_u64());
    assert_eq!(
        plugin(&json, "host")["abi_version"],
        format!("{ABI_MAJOR}.{ABI_MINOR}")
    );
}

#[test]
fn handles_are_bound_to_their_owner() {
    let rt = both_runtime();
    let (d0, d1) = (
        rt.device("testdev", 0).unwrap(),
        rt.device("testdev", 1).unwrap(),
    );
    let image = synthetic_elf(TESTDEV_MACHINE, &["fill", "other"]);
    let (a, b) = (
        offload_tests::load(&d0, &image).unwrap(),
        offload_tests::load(&d0, &image).unwrap(),
    );
    let ka = a.kernel("fill").unwrap();
    let buf = d0.alloc_buffer(64).unwrap();
    // SAFETY: the device API is used on this test's own allocations only, with no HostBuffer or safe-layer queue on them.
    let (r0, r1) = (unsafe { offload::raw::device(&d0) }, unsafe {
        offload::raw::device(&d1)
    });
    // A program of device 0 used on device 1.
    let e = r1.kernel(a.handle(), "fill").unwrap_err().to_string();
    assert!(
        e.contains("belongs to device testdev:0, not testdev:1"),
        "{e}"
    );
    // A kernel handle used as a program handle, and the other way round.
    let e = r0
        .kernel(offload::ProgramHandle(ka.handle().0), "fill")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("is a kernel handle") && e.contains("not a program handle"),
        "{e}"
    );
    // SAFETY: a test kernel on this test's own allocations, each as long as the kernel touches.
    let e = unsafe {
        r0.launch(
            offload::KernelHandle(a.handle().0),
            &LaunchDims::linear(1, 1),
            &[],
            None,
        )
    }
    .unwrap_err()
    .to_string();
    assert!(e.contains("is a program handle"), "{e}");
    // Handles after unload, destroy and free (a `Kernel` keeps its program loaded: only its
    // handle is kept here).
    let kb = b.kernel("fill").unwrap().handle();
    let b_handle = b.handle();
    drop(b);
    let e = r0.kernel(b_handle, "fill").unwrap_err().to_string();
    assert!(
        e.contains("no longer valid: its program was unloaded"),
        "{e}"
    );
    // SAFETY: a test kernel on this test's own allocations, each as long as the kernel touches.
    let e = unsafe {
        r0.launch(
            kb,
            &LaunchDims::linear(1, 1),
            &[KernelArg::Ptr(buf.ptr())],
            None,
        )
    }
    .unwrap_err()
    .to_string();
    assert!(e.contains("no longer valid"), "{e}");
    let q = r0.queue_create().unwrap();
    r0.queue_destroy(q).unwrap();
    assert!(
        r0.queue_synchronize(q)
            .unwrap_err()
            .to_string()
            .contains("queue was destroyed")
    );
    let ev = r0.event_create().unwrap();
    r0.event_destroy(ev).unwrap();
    assert!(
        r0.event_query(ev)
            .unwrap_err()
            .to_string()
            .contains("event was destroyed")
    );
    // Memory of device 0 passed to a launch, or freed, on device 1.
    let p1 = offload_tests::load(&d1, &image).unwrap();
    let k1 = p1.kernel("fill").unwrap();
    // SAFETY: the layer refuses this launch before the kernel runs (what the test checks).
    let e = unsafe {
        k1.launch(LaunchDims::linear(1, 1))
            .args_raw(&[KernelArg::Ptr(buf.ptr())])
            .unchecked()
            .run()
    }
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("not inside any live allocation or global of testdev:1"),
        "{e}"
    );
    // SAFETY: device 1 refuses device 0's buffer (what the test checks).
    assert!(unsafe { r1.free(buf.ptr()) }.is_err());
    let raw_ptr = r0.alloc(16, offload::MemoryKind::Device).unwrap();
    // SAFETY: the test's own allocation; the second free is refused (what the test checks).
    unsafe { r0.free(raw_ptr) }.unwrap();
    // SAFETY: as above.
    let twice = unsafe { r0.free(raw_ptr) };
    assert!(twice.unwrap_err().to_string().contains("double free"));
    // The right combinations still work.
    // SAFETY: the buffers are as long as the kernel touches for these arguments.
    unsafe {
        ka.launch(LaunchDims::linear(1, 4))
            .args_raw(&[KernelArg::U32(1), KernelArg::Ptr(buf.ptr())])
            .unchecked()
            .run()
    }
    .unwrap();
}

#[test]
fn a_failed_queue_reports_its_error_and_refuses_work_until_recreated() {
    let rt = both_runtime();
    let d = rt.device("testdev", 0).unwrap();
    let program =
        offload_tests::load(&d, &synthetic_elf(TESTDEV_MACHINE, &["fill", "panic"])).unwrap();
    let (fill, panic) = (
        program.kernel("fill").unwrap(),
        program.kernel("panic").unwrap(),
    );
    let buf = d.alloc_buffer(64).unwrap();
    // SAFETY: the device API is used on this test's own allocations only, with no HostBuffer or safe-layer queue on them.
    let raw = unsafe { offload::raw::device(&d) };
    let q = raw.queue_create().unwrap();
    let dims = LaunchDims::linear(1, 4);
    let args = [KernelArg::U32(9), KernelArg::Ptr(buf.ptr())];
    // SAFETY: a test kernel on this test's own allocations, each as long as the kernel touches.
    unsafe { raw.launch(fill.handle(), &dims, &args, Some(q)) }.unwrap();
    // SAFETY: a test kernel on this test's own allocations, each as long as the kernel touches.
    unsafe { raw.launch(panic.handle(), &dims, &[], Some(q)) }.unwrap();
    // Work submitted before the failure is known is skipped, not run on bad state.
    // SAFETY: a test kernel on this test's own allocations, each as long as the kernel touches.
    let _ = unsafe { raw.launch(fill.handle(), &dims, &args, Some(q)) };
    let event = raw.event_create().unwrap();
    raw.event_record(event, q).unwrap();
    let e = raw.queue_synchronize(q).unwrap_err();
    assert!(matches!(e, Error::PluginPanic(_)), "{e:?}");
    assert!(
        e.to_string()
            .contains("testdev kernel 'panic' was launched"),
        "{e}"
    );
    // Sticky, and never a hang.
    assert!(raw.queue_synchronize(q).is_err());
    // SAFETY: a test kernel on this test's own allocations, each as long as the kernel touches.
    let e = unsafe { raw.launch(fill.handle(), &dims, &args, Some(q)) }
        .unwrap_err()
        .to_string();
    assert!(e.contains("destroy it and create a new one"), "{e}");
    // An event recorded on the failed queue completes with its error.
    assert!(raw.event_synchronize(event).is_err());
    assert!(raw.event_query(event).unwrap());
    // Destroying reports the failure once more; a new queue works.
    assert!(raw.queue_destroy(q).is_err());
    let q2 = raw.queue_create().unwrap();
    // SAFETY: a test kernel on this test's own allocations, each as long as the kernel touches.
    unsafe { raw.launch(fill.handle(), &dims, &args, Some(q2)) }.unwrap();
    raw.queue_synchronize(q2).unwrap();
    let mut out = vec![0u8; 16];
    buf.slice(..16).unwrap().read(&mut out).unwrap();
    assert_eq!(&out[..4], &9u32.to_le_bytes());
    raw.queue_destroy(q2).unwrap();
}

#[test]
fn a_library_that_is_not_a_plugin_is_reported() {
    let dir = scratch("not-a-plugin");
    std::fs::write(dir.join("liboffload_plugin_junk.so"), b"not a library").unwrap();
    std::fs::copy(
        host_kernel("empty"),
        dir.join("liboffload_plugin_kernel.so"),
    )
    .unwrap();
    let rt = Runtime::with_plugin_dirs(&[dir, host_plugin_dir()], None);
    let status = |name: &str| rt.plugin(name).unwrap().status();
    let junk = status("junk");
    assert_eq!(junk.label(), "failed");
    assert!(
        junk.reason().unwrap().contains("cannot open library"),
        "{junk:?}"
    );
    let kernel = status("kernel");
    assert!(
        kernel
            .reason()
            .unwrap()
            .contains("no entry symbol 'offload_plugin_entry'"),
        "{kernel:?}"
    );
    assert_eq!(status("host").label(), "ok");
}

#[test]
fn header_checks_read_nothing_past_a_bad_field() {
    // A table that is only a header with a wrong magic: the checker must stop at the magic.
    let fake = [0u64; 8];
    // SAFETY: `fake` is 64 readable bytes, more than a header.
    let e = unsafe { check_table(fake.as_ptr() as *const PluginTable, "fake.so".as_ref()) }
        .unwrap_err();
    assert!(matches!(e, Error::AbiMismatch(_)), "{e}");
    assert!(e.to_string().contains("fake.so"), "{e}");
    let mut with_magic = [0u64; 8];
    with_magic[0] = ABI_MAGIC;
    // abi_major = 0 (the next field): refused as a version mismatch.
    // SAFETY: as above.
    let e = unsafe {
        check_table(
            with_magic.as_ptr() as *const PluginTable,
            "fake.so".as_ref(),
        )
    }
    .unwrap_err();
    assert!(e.to_string().contains("plugin speaks ABI 0.0"), "{e}");
    // SAFETY: null is allowed by the contract.
    let e = unsafe { check_table(std::ptr::null(), "fake.so".as_ref()) }.unwrap_err();
    assert!(matches!(e, Error::PluginLoad(_)), "{e}");
}

/// A hook that panics on a device whose work outlives the call (a GPU's: testdev's `gpu-like`
/// mode) may leave that work running: the operation's memory is quarantined and the device
/// failed for good, as for an unsettled failure. On the host-like device (the default) a panic
/// fails only that call. Sets `OFFLOAD_TESTDEV_MODE` in this process (a process per test).
#[test]
fn a_hook_that_panics_on_a_gpu_like_device_fails_it_for_good() {
    let image = synthetic_elf(TESTDEV_MACHINE, &["fill", "panic"]);
    let panic_once = |rt: &Runtime| {
        let d = rt.device("testdev", 0).unwrap();
        let program = offload_tests::load(&d, &image).unwrap();
        let panic = program.kernel("panic").unwrap();
        let buf = d.alloc_buffer(64).unwrap();
        // SAFETY: the kernel panics before it touches anything (what the test checks).
        let e = unsafe {
            panic
                .launch(LaunchDims::linear(1, 1))
                .args_raw(&[KernelArg::Ptr(buf.ptr())])
                .unchecked()
                .run()
        }
        .unwrap_err();
        assert!(matches!(e, Error::PluginPanic(_)), "{e:?}");
        drop(buf);
        d.alloc_buffer(64).map(drop)
    };
    panic_once(&both_runtime()).unwrap();
    // SAFETY: no other thread of this test process reads the environment now.
    unsafe { std::env::set_var("OFFLOAD_TESTDEV_MODE", "gpu-like") };
    let rt = Runtime::with_plugin_dirs(&[testdev_plugin_dir()], None);
    let e = panic_once(&rt).unwrap_err().to_string();
    assert!(
        e.contains("failed for good") && e.contains("a backend hook panicked"),
        "{e}"
    );
}
