//! The runtime API over the real host plugin loaded through the real loader: concurrency,
//! queues, memory checks, and the address-reuse scenario of upstream's JIT cache bug.

use offload::{Error, KernelArg, LaunchDims, QueueHandle};
use offload_tests::*;
use std::sync::Arc;

fn read_f32(buf: &offload::DeviceBuffer, n: usize) -> Vec<f32> {
    let mut raw = vec![0u8; n * 4];
    buf.read(&mut raw).unwrap();
    raw.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn eight_threads_launching_concurrently_on_one_device_all_get_correct_results() {
    let rt = host_runtime();
    let image = std::fs::read(host_kernel("saxpy")).unwrap();
    let device = rt.device("host", 0).unwrap();
    let program = Arc::new(offload_tests::load(&device, &image).unwrap());
    let n = 50_001usize;
    std::thread::scope(|s| {
        for t in 0..8u32 {
            let (program, device) = (program.clone(), device.clone());
            s.spawn(move || {
                let kernel = program.kernel("saxpy").unwrap();
                let a = 1.0 + t as f32;
                let x: Vec<f32> = (0..n).map(|i| (i % 113) as f32).collect();
                let y: Vec<f32> = (0..n).map(|i| t as f32 - (i % 7) as f32).collect();
                let dx = device.alloc_buffer((n * 4) as u64).unwrap();
                let dy = device.alloc_buffer((n * 4) as u64).unwrap();
                for round in 0..5 {
                    dx.write(&f32_bytes(&x)).unwrap();
                    dy.write(&f32_bytes(&y)).unwrap();
                    // SAFETY: the buffers are as long as the kernel touches for these arguments.
                    unsafe {
                        kernel
                            .launch(LaunchDims::linear(n.div_ceil(128) as u32, 128))
                            .args_raw(&[
                                KernelArg::I32(n as i32),
                                KernelArg::F32(a),
                                KernelArg::Ptr(dx.ptr()),
                                KernelArg::Ptr(dy.ptr()),
                            ])
                            .unchecked()
                            .run()
                    }
                    .unwrap();
                    let got = read_f32(&dy, n);
                    for i in 0..n {
                        assert_eq!(
                            got[i],
                            a * x[i] + y[i],
                            "thread {t} round {round} element {i}"
                        );
                    }
                }
            });
        }
    });
}

#[test]
fn a_queue_runs_copies_and_launches_in_order_asynchronously() {
    let rt = host_runtime();
    let image = std::fs::read(host_kernel("saxpy")).unwrap();
    let device = rt.device("host", 0).unwrap();
    let program = offload_tests::load(&device, &image).unwrap();
    let kernel = program.kernel("saxpy").unwrap();
    // SAFETY: the device API is used on this test's own allocations only, with no HostBuffer or safe-layer queue on them.
    let raw = unsafe { offload::raw::device(&device) };
    let n = 10_000usize;
    let x: Vec<u8> = f32_bytes(&(0..n).map(|i| i as f32).collect::<Vec<_>>());
    let y: Vec<u8> = f32_bytes(&vec![1.0; n]);
    let dx = device.alloc_buffer((n * 4) as u64).unwrap();
    let dy = device.alloc_buffer((n * 4) as u64).unwrap();
    let q = raw.queue_create().unwrap();
    let mut out = vec![0u8; n * 4];
    // SAFETY: every host buffer outlives the queue_synchronize below and is not touched
    // until then.
    unsafe {
        raw.copy_to_device(dx.ptr(), x.as_ptr(), x.len(), Some(q))
            .unwrap();
        raw.copy_to_device(dy.ptr(), y.as_ptr(), y.len(), Some(q))
            .unwrap();
        for _ in 0..3 {
            raw.launch(
                kernel.handle(),
                &LaunchDims::linear(n.div_ceil(64) as u32, 64),
                &[
                    KernelArg::I32(n as i32),
                    KernelArg::F32(2.0),
                    KernelArg::Ptr(dx.ptr()),
                    KernelArg::Ptr(dy.ptr()),
                ],
                Some(q),
            )
            .unwrap();
        }
        raw.copy_from_device(out.as_mut_ptr(), dy.ptr(), out.len(), Some(q))
            .unwrap();
    }
    raw.queue_synchronize(q).unwrap();
    let got: Vec<f32> = out
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    for (i, g) in got.iter().enumerate() {
        assert_eq!(*g, 1.0 + 6.0 * i as f32, "element {i}");
    }
    // A range outside every allocation is refused when it is enqueued, and the queue stays
    // usable.
    // SAFETY: as above (nothing is enqueued by the failing call).
    let e = unsafe { raw.copy_to_device(dx.ptr(), x.as_ptr(), x.len() + 4, Some(q)) }.unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    assert!(
        e.to_string().contains("not inside any live allocation"),
        "{e}"
    );
    raw.queue_synchronize(q).unwrap();
    raw.queue_destroy(q).unwrap();
    assert!(matches!(raw.queue_synchronize(q), Err(Error::NotFound(_))));
    assert!(matches!(
        raw.queue_synchronize(QueueHandle(987_654)),
        Err(Error::NotFound(_))
    ));
}

#[test]
fn bad_pointers_and_launch_shapes_are_errors_not_crashes() {
    let rt = host_runtime();
    let image = std::fs::read(host_kernel("saxpy")).unwrap();
    let device = rt.device("host", 0).unwrap();
    let program = offload_tests::load(&device, &image).unwrap();
    let kernel = program.kernel("saxpy").unwrap();
    let buf = device.alloc_buffer(64).unwrap();
    let args = |p: u64| {
        [
            KernelArg::I32(16),
            KernelArg::F32(1.0),
            KernelArg::Ptr(buf.ptr()),
            KernelArg::Ptr(offload::DevicePtr(p)),
        ]
    };
    // SAFETY: the layer refuses this launch before the kernel runs (what the test checks).
    let e = unsafe {
        kernel
            .launch(LaunchDims::linear(1, 16))
            .args_raw(&args(0xdead_0000))
            .unchecked()
            .run()
    }
    .unwrap_err();
    assert!(e.to_string().contains("argument 3"), "{e}");
    // SAFETY: the layer refuses this launch before the kernel runs (what the test checks).
    let e = unsafe {
        kernel
            .launch(LaunchDims::linear(0, 16))
            .args_raw(&args(buf.ptr().0))
            .unchecked()
            .run()
    }
    .unwrap_err();
    assert!(e.to_string().contains("grid dimension x is 0"), "{e}");
    // SAFETY: the layer refuses this launch before the kernel runs (what the test checks).
    let e = unsafe {
        kernel
            .launch(LaunchDims::linear(1, 2048))
            .args_raw(&args(buf.ptr().0))
            .unchecked()
            .run()
    }
    .unwrap_err();
    assert!(e.to_string().contains("at most 1024"), "{e}");
    assert!(buf.write(&[0u8; 65]).is_err());
    // SAFETY: the device API is used on this test's own allocations only, with no HostBuffer or safe-layer queue on them.
    // The layer refuses it (what the test checks).
    let e = unsafe { offload::raw::device(&device).free(offload::DevicePtr(buf.ptr().0 + 8)) }
        .unwrap_err();
    assert!(
        e.to_string().contains("not the start of a live allocation"),
        "{e}"
    );
    let e = program.kernel("nope").unwrap_err();
    assert!(matches!(e, Error::NotFound(_)), "{e}");
    assert!(e.to_string().contains("exported functions: saxpy"), "{e}");
    // Functions the image merely imports (from libc) are not kernels.
    assert!(program.kernel("memcpy").is_err());
    // SAFETY: the device API is used on this test's own allocations only, with no HostBuffer or safe-layer queue on them.
    let e = unsafe { offload::raw::device(&device) }
        .alloc(u64::MAX / 2, offload::MemoryKind::Device)
        .unwrap_err();
    assert!(matches!(e, Error::OutOfMemory(_)), "{e}");
}

#[test]
fn a_new_image_at_a_freed_images_address_runs_its_own_kernels() {
    let rt = host_runtime();
    let device = rt.device("host", 0).unwrap();
    let a = std::fs::read(host_kernel("variant_a")).unwrap();
    let b = std::fs::read(host_kernel("variant_b")).unwrap();
    let mut bytes = Vec::with_capacity(a.len().max(b.len()));
    let out = device.alloc_buffer(64 * 4).unwrap();
    let run = |image: &[u8]| run_which(&device, &out, image);
    for round in 0..20 {
        bytes.clear();
        bytes.extend_from_slice(&a);
        let addr = bytes.as_ptr();
        assert!(run(&bytes).iter().all(|&v| v == 0xAAAA), "round {round}: A");
        bytes.clear();
        bytes.extend_from_slice(&b);
        assert_eq!(bytes.as_ptr(), addr, "B must be loaded from A's address");
        let got = run(&bytes);
        for (i, v) in got.iter().enumerate() {
            assert_eq!(
                *v,
                0xBBBB + i as u32,
                "round {round}: B's kernel must run, never A's"
            );
        }
    }
}

/// Device selection: every device in order with its kind, specs (`plugin[:index]`) with errors
/// that say what is wrong, and the default device (`OFFLOAD_DEFAULT_DEVICE`, else a GPU, else
/// a CPU). Sets `OFFLOAD_DEFAULT_DEVICE` in this process: a process per test (nextest).
#[test]
fn devices_are_listed_chosen_by_spec_and_by_default() {
    let rt = offload::Runtime::with_plugin_dirs(&[host_plugin_dir(), testdev_plugin_dir()], None);
    let devices = rt.devices();
    let names: Vec<String> = devices.iter().map(|d| d.to_string()).collect();
    let hosts = rt.plugin("host").unwrap().device_count().unwrap();
    assert!(hosts >= 1);
    assert_eq!(
        names.iter().filter(|n| n.starts_with("host:")).count(),
        hosts
    );
    assert!(names.contains(&"testdev:1".to_string()), "{names:?}");
    for d in &devices {
        let want = if d.plugin_name() == "host" {
            offload::DeviceKind::Cpu
        } else {
            offload::DeviceKind::Other
        };
        assert_eq!(d.kind(), want, "{d}");
    }
    assert_eq!(
        rt.device_by_spec("testdev:1").unwrap().to_string(),
        "testdev:1"
    );
    assert_eq!(
        rt.device_by_spec("testdev").unwrap().to_string(),
        "testdev:0"
    );
    for (spec, says) in [
        (
            "testdev:9",
            "device 'testdev:9': device testdev:9: plugin 'testdev' has 2 devices",
        ),
        ("nope:0", "plugin 'nope' (found: "),
        ("host:x", "'x' is not a device index"),
        (":1", "no plugin name"),
    ] {
        let e = rt.device_by_spec(spec).unwrap_err().to_string();
        assert!(e.contains(says), "{spec}: {e}");
    }
    // No GPU here: the first CPU device.
    assert_eq!(rt.default_device().unwrap().to_string(), "host:0");
    // SAFETY: no other thread of this test process reads the environment now.
    unsafe { std::env::set_var(offload::ENV_DEFAULT_DEVICE, "testdev:1") };
    assert_eq!(rt.default_device().unwrap().to_string(), "testdev:1");
    // SAFETY: as above.
    unsafe { std::env::set_var(offload::ENV_DEFAULT_DEVICE, "testdev:7") };
    let e = rt.default_device().unwrap_err().to_string();
    assert!(
        e.contains("environment variable OFFLOAD_DEFAULT_DEVICE") && e.contains("has 2 devices"),
        "{e}"
    );
    // SAFETY: as above.
    unsafe { std::env::remove_var(offload::ENV_DEFAULT_DEVICE) };
    // Nowhere to look: the error says where it looked.
    let empty = scratch("no-plugins");
    let none = offload::Runtime::with_plugin_dirs(std::slice::from_ref(&empty), None);
    assert!(none.devices().is_empty());
    let e = none.default_device().unwrap_err().to_string();
    assert!(
        e.contains("no plugin was found (searched ") && e.contains(empty.to_str().unwrap()),
        "{e}"
    );
}

/// `Runtime::builder()`: settings in code; a build that finds no plugin, or lacks one it was
/// told to load, fails naming the directories; JIT options apply to the process's first
/// runtime and are refused after it.
#[test]
fn the_runtime_builder_takes_settings_in_code_and_fails_when_nothing_is_found() {
    let cache = scratch("builder-cache");
    let rt = offload::Runtime::builder()
        .plugin_dir(host_plugin_dir())
        .only(["host"])
        .jit_opt_level(2)
        .jit_disk_cache(offload::DiskMode::ReadOnly)
        .jit_cache_dir(&cache)
        .build()
        .unwrap();
    assert_eq!(rt.plugins().len(), 1);
    let config = rt.jit().config().unwrap();
    assert_eq!(config.options.opt_level, 2);
    assert_eq!(config.disk.mode, offload::DiskMode::ReadOnly);
    assert_eq!(config.disk.dir, cache);
    assert!(!rt.devices().is_empty());
    let e = offload::Runtime::builder()
        .plugin_dir(host_plugin_dir())
        .jit_opt_level(1)
        .build()
        .unwrap_err()
        .to_string();
    assert!(e.contains("already configured"), "{e}");
    let empty = scratch("builder-empty");
    for (builder, says) in [
        (
            offload::Runtime::builder()
                .plugin_dir(&empty)
                .linked_host(false),
            format!("no offload plugin found: searched {}", empty.display()),
        ),
        (
            offload::Runtime::builder().plugin_dir(empty.join("nope")),
            "does not exist or is not a directory".to_string(),
        ),
        (
            offload::Runtime::builder()
                .plugin_dir(host_plugin_dir())
                .only(["host", "nope"]),
            "only() names plugin 'nope', but no liboffload_plugin_nope.so".to_string(),
        ),
        (
            offload::Runtime::builder().jit_opt_level(7),
            "JIT optimisation level 7: expected 0 to 3".to_string(),
        ),
    ] {
        let e = builder.build().unwrap_err().to_string();
        assert!(e.contains(&says), "{e}");
    }
    // With nothing in the directories, the host backend linked into this program serves the
    // host (the `host` feature), with the same checks as the plugin library.
    let rt = offload::Runtime::builder()
        .plugin_dir(&empty)
        .build()
        .unwrap();
    let slot = rt.plugin("host").unwrap();
    assert!(slot.is_linked() && slot.abi_version().is_none(), "{slot:?}");
    assert_eq!(slot.path().to_str(), Some(offload::LINKED));
    let device = rt.default_device().unwrap();
    assert_eq!(device.to_string(), "host:0");
    // One device object per device: the same device twice is the same device.
    let again = rt.device("host", 0).unwrap();
    // SAFETY: only the trait objects' addresses are compared.
    let (a, b) = unsafe { (offload::raw::device(&device), offload::raw::device(&again)) };
    assert!(std::ptr::eq(
        Arc::as_ptr(a) as *const (),
        Arc::as_ptr(b) as *const ()
    ));
    let e = device.alloc::<u8>(0).unwrap_err().to_string();
    assert!(e.contains("cannot be allocated"), "{e}");
    // SAFETY: the device API is used on this test's own allocations only, with no HostBuffer or safe-layer queue on them.
    let e = unsafe { offload::raw::device(&device) }
        .alloc(0, offload::MemoryKind::Device)
        .unwrap_err()
        .to_string();
    assert!(e.contains("allocation of 0 bytes"), "{e}");
    let e = offload_tests::load(&device, &[]).unwrap_err().to_string();
    assert!(e.contains("image is empty"), "{e}");
    let program =
        offload_tests::load(&device, &std::fs::read(host_kernel("saxpy")).unwrap()).unwrap();
    let saxpy = program.kernel("saxpy").unwrap();
    let e = saxpy
        .launch(LaunchDims::linear(1, 4096))
        .arg(0i32)
        .arg(1.0f32)
        .arg(&device.upload(&[0.0f32]).unwrap())
        .arg(&mut device.upload(&[0.0f32]).unwrap())
        .run()
        .unwrap_err()
        .to_string();
    assert!(e.contains("at most 1024"), "{e}");
    let x = device.upload(&[1.0f32; 8]).unwrap();
    let mut y = device.upload(&[1.0f32; 8]).unwrap();
    saxpy
        .launch(LaunchDims::linear(1, 8))
        .arg(8i32)
        .arg(2.0f32)
        .arg(&x)
        .arg(&mut y)
        .run()
        .unwrap();
    assert_eq!(y.to_vec().unwrap(), vec![3.0f32; 8]);
}

/// Typed buffers: upload, to_vec, read and write with their lengths checked (errors, not
/// panics), fill over several host chunks, device-to-device copies (refused across devices),
/// and saxpy with typed buffers and a launch for its elements.
#[test]
fn typed_buffers_carry_their_element_type_and_length() {
    let rt = host_runtime();
    let device = rt.device("host", 0).unwrap();
    let x: Vec<f32> = (0..1000).map(|i| i as f32).collect();
    let dx = device.upload(&x).unwrap();
    assert_eq!((dx.len(), dx.size()), (1000, 4000));
    assert_eq!(dx.to_vec().unwrap(), x);
    let dy = device.alloc::<f32>(1000).unwrap();
    dy.fill(1.0).unwrap();
    let so = std::fs::read(host_kernel("saxpy")).unwrap();
    let program = offload_tests::load(&device, &so).unwrap();
    let saxpy = program.kernel("saxpy").unwrap();
    // SAFETY: the buffers are as long as the kernel touches for these arguments.
    unsafe {
        saxpy
            .launch(LaunchDims::for_elems(1000, 256).unwrap())
            .args_raw(&[
                KernelArg::I32(1000),
                KernelArg::F32(2.0),
                dx.arg(),
                dy.arg(),
            ])
            .unchecked()
            .run()
    }
    .unwrap();
    let y = dy.to_vec().unwrap();
    assert!(
        y.iter()
            .enumerate()
            .all(|(i, v)| *v == 2.0 * i as f32 + 1.0)
    );
    // Lengths: a write or read of another length, longer or shorter, is an error naming both
    // sizes (as copy_from_slice refuses it); a part goes through a view of that part.
    for len in [1001, 999, 0] {
        let e = dy.write(&vec![0.0; len]).unwrap_err().to_string();
        assert!(
            e.contains(&format!(
                "write of {len} elements ({} bytes) against a buffer or view of 1000 elements of \
                 f32 (4000 bytes)",
                len * 4
            )) && e.contains("the lengths must be equal"),
            "{e}"
        );
        let mut other = vec![0.0f32; len];
        assert!(dy.read(&mut other).is_err());
    }
    let mut head = [0.0f32; 3];
    dy.slice(..3).unwrap().read(&mut head).unwrap();
    assert_eq!(head, [1.0, 3.0, 5.0]);
    dy.slice(997..).unwrap().write(&[7.0; 3]).unwrap();
    assert_eq!(
        dy.to_vec().unwrap()[996..],
        [2.0 * 996.0 + 1.0, 7.0, 7.0, 7.0]
    );
    // fill in more than one chunk of host memory, of a wider type.
    let big = device.alloc::<f64>(300_000).unwrap();
    big.fill(-2.5).unwrap();
    assert!(big.to_vec().unwrap().iter().all(|v| *v == -2.5));
    let rgb = device.upload(&[[1u8, 2, 3], [4, 5, 6]]).unwrap();
    assert_eq!(rgb.to_vec().unwrap(), vec![[1, 2, 3], [4, 5, 6]]);
    // Device to device.
    let copy = device.alloc::<f32>(1000).unwrap();
    copy.copy_from(&dx).unwrap();
    assert_eq!(copy.to_vec().unwrap(), x);
    let short = device.alloc::<f32>(10).unwrap();
    assert!(short.copy_from(&dx).is_err());
    let other = offload::Runtime::with_plugin_dirs(&[testdev_plugin_dir()], None)
        .device("testdev", 0)
        .unwrap()
        .alloc::<f32>(1000)
        .unwrap();
    let e = other.copy_from(&dx).unwrap_err().to_string();
    assert!(e.contains("different devices"), "{e}");
    // Zero elements: an error, as a zero-byte allocation is.
    assert!(device.alloc::<u32>(0).is_err());
}

/// A synchronous read right after a queued launch that writes the buffer sees what the launch
/// wrote (the layer waits for queued work on the same memory), every time; so does a
/// synchronous write before the next queued launch reads it.
#[test]
fn a_synchronous_read_after_queued_work_on_the_buffer_sees_that_work() {
    let rt = host_runtime();
    let device = rt.device("host", 0).unwrap();
    let so = std::fs::read(host_kernel("saxpy")).unwrap();
    let program = offload_tests::load(&device, &so).unwrap();
    let saxpy = program.kernel("saxpy").unwrap();
    let n = 1 << 20;
    let dx = device.upload(&vec![1.0f32; n]).unwrap();
    let dy = device.alloc::<f32>(n).unwrap();
    // Other work queued first keeps the queue busy, so the read below is issued while the
    // launch on `dy` still waits its turn.
    let big = 4 << 20;
    let bx = device.upload(&vec![1.0f32; big]).unwrap();
    let by = device.alloc::<f32>(big).unwrap();
    // SAFETY: the device API is used on this test's own allocations only, with no HostBuffer or safe-layer queue on them.
    let raw = unsafe { offload::raw::device(&device) }.clone();
    let queue = raw.queue_create().unwrap();
    let dims = LaunchDims::for_elems(n as u64, 256).unwrap();
    let big_dims = LaunchDims::for_elems(big as u64, 256).unwrap();
    for round in 0..6 {
        dy.fill(round as f32).unwrap();
        for _ in 0..2 {
            // SAFETY: a test kernel on this test's own allocations, each as long as the kernel touches.
            unsafe {
                raw.launch(
                    saxpy.handle(),
                    &big_dims,
                    &[
                        KernelArg::I32(big as i32),
                        KernelArg::F32(1.0),
                        bx.arg(),
                        by.arg(),
                    ],
                    Some(queue),
                )
            }
            .unwrap();
        }
        // y = 3 * 1 + round, queued; then read at once, without synchronising the queue.
        // SAFETY: a test kernel on this test's own allocations, each as long as the kernel touches.
        unsafe {
            raw.launch(
                saxpy.handle(),
                &dims,
                &[
                    KernelArg::I32(n as i32),
                    KernelArg::F32(3.0),
                    dx.arg(),
                    dy.arg(),
                ],
                Some(queue),
            )
        }
        .unwrap();
        let mut probe = vec![0.0f32; n];
        dy.read(&mut probe).unwrap();
        let want = 3.0 + round as f32;
        assert!(
            probe.iter().all(|v| *v == want),
            "round {round}: read {} before the queued launch finished (want {want})",
            probe[n - 1]
        );
    }
    raw.queue_synchronize(queue).unwrap();
    raw.queue_destroy(queue).unwrap();
}

/// The safe queues and events: a queued upload of owned host data, a queued launch, an event
/// that a second queue waits for before its copy, and the results; work for another device's
/// queue is refused.
#[test]
fn queues_and_events_order_work_and_own_what_they_need() {
    let rt = host_runtime();
    let device = rt.device("host", 0).unwrap();
    let so = std::fs::read(host_kernel("saxpy")).unwrap();
    let program = offload_tests::load(&device, &so).unwrap();
    let saxpy = program.kernel("saxpy").unwrap();
    let n = 1 << 18;
    let dx = device.alloc::<f32>(n).unwrap();
    let dy = device.alloc::<f32>(n).unwrap();
    let out = device.alloc::<f32>(n).unwrap();
    let (a, b) = (device.queue().unwrap(), device.queue().unwrap());
    a.upload(&dx, vec![2.0; n]).unwrap();
    a.upload(&dy, (0..n).map(|i| i as f32).collect()).unwrap();
    // SAFETY: the buffers are as long as the kernel touches for these arguments.
    unsafe {
        saxpy
            .launch(LaunchDims::for_elems(n as u64, 256).unwrap())
            .args_raw(&[
                KernelArg::I32(n as i32),
                KernelArg::F32(0.5),
                dx.arg(),
                dy.arg(),
            ])
            .on(&a)
            .unchecked()
            .run()
    }
    .unwrap();
    let done = a.record().unwrap();
    b.wait(&done).unwrap();
    b.copy(&out, &dy).unwrap();
    b.synchronize().unwrap();
    assert!(done.is_complete().unwrap());
    done.synchronize().unwrap();
    let got = out.to_vec().unwrap();
    assert!(got.iter().enumerate().all(|(i, v)| *v == i as f32 + 1.0));
    // Too long, and another device's buffer or queue: errors.
    assert!(a.upload(&dx, vec![0.0; n + 1]).is_err());
    let other = offload::Runtime::with_plugin_dirs(&[testdev_plugin_dir()], None);
    let other = other.device("testdev", 0).unwrap();
    let q = other.queue().unwrap();
    // SAFETY: the layer refuses this launch before the kernel runs (what the test checks).
    let e = unsafe {
        saxpy
            .launch(LaunchDims::linear(1, 1))
            .on(&q)
            .unchecked()
            .run()
    }
    .unwrap_err()
    .to_string();
    assert!(e.contains("another device"), "{e}");
    assert!(q.copy(&out, &dy).is_err());
    drop((a, b));
}

#[test]
fn several_host_devices_are_independent() {
    // OFFLOAD_HOST_DEVICES is read by the plugin at init; use the binary so the setting is
    // scoped to one process.
    let out = offload(&["info", "--json"], &[("OFFLOAD_HOST_DEVICES", "3")]);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let host = json["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "host")
        .unwrap();
    assert_eq!(host["devices"].as_array().unwrap().len(), 3);
    let so = host_kernel("saxpy");
    let out = offload(
        &[
            "run",
            so.to_str().unwrap(),
            "--kernel",
            "saxpy",
            "--device",
            "host:2",
            "--arg",
            "i32:4",
            "--arg",
            "f32:2",
            "--arg",
            "buf:f32:4:iota",
            "--arg",
            "buf:f32:4:fill=1",
            "--block",
            "4",
            "--json",
        ],
        &[("OFFLOAD_HOST_DEVICES", "3")],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(json["device"], "host:2");
    assert_eq!(
        json["buffers"][1]["head"],
        serde_json::json!([1.0, 3.0, 5.0, 7.0])
    );
    let out = offload(
        &[
            "run",
            so.to_str().unwrap(),
            "--kernel",
            "saxpy",
            "--device",
            "host:3",
        ],
        &[("OFFLOAD_HOST_DEVICES", "3")],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("has 3 devices"), "{}", stderr(&out));
}

/// Event timing: the time between two events of a queue covers the work between them, and
/// is refused for a start after its end, for events of other devices and (per plugin) for a
/// plugin of an older ABI.
#[test]
fn events_time_the_work_between_them() {
    let rt = host_runtime();
    let device = rt.device("host", 0).unwrap();
    let program =
        offload_tests::load(&device, &std::fs::read(host_kernel("saxpy")).unwrap()).unwrap();
    let saxpy = program.kernel("saxpy").unwrap();
    let n = 1 << 22;
    let x = device.upload(&vec![1.0f32; n]).unwrap();
    let mut y = device.upload(&vec![1.0f32; n]).unwrap();
    let q = device.queue().unwrap();
    let start = q.record().unwrap();
    let wall = std::time::Instant::now();
    for _ in 0..4 {
        saxpy
            .launch(LaunchDims::for_elems(n as u64, 256).unwrap())
            .arg(n as i32)
            .arg(1.0f32)
            .arg(&x)
            .arg(&mut y)
            .on(&q)
            .run()
            .unwrap();
    }
    let end = q.record().unwrap();
    end.synchronize().unwrap();
    let wall = wall.elapsed();
    let took = end.elapsed_since(&start).unwrap();
    // Four saxpy passes over 16 MiB take time, and no more than the caller waited.
    assert!(
        took > std::time::Duration::ZERO && took <= wall,
        "{took:?} of {wall:?}"
    );
    let e = start.elapsed_since(&end).unwrap_err().to_string();
    assert!(
        e.contains("the start event completed after the end event"),
        "{e}"
    );
    let other = offload::Runtime::with_plugin_dirs(&[testdev_plugin_dir()], None);
    let oq = other.device("testdev", 0).unwrap().queue().unwrap();
    let foreign = oq.record().unwrap();
    foreign.synchronize().unwrap();
    let e = end.elapsed_since(&foreign).unwrap_err().to_string();
    assert!(e.contains("belong to different devices"), "{e}");
}
