//! The generic device layer on the host backend: memory that work uses outlives a free, safe
//! calls on many threads never crash or race, events order work across queues.

use offload::{KernelArg, LaunchDims};
use offload_tests::*;
use std::sync::Arc;

fn f32s(raw: &[u8]) -> Vec<f32> {
    raw.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn saxpy_args(
    n: usize,
    a: f32,
    x: &offload::DeviceBuffer,
    y: &offload::DeviceBuffer,
) -> [KernelArg; 4] {
    [
        KernelArg::I32(n as i32),
        KernelArg::F32(a),
        KernelArg::Ptr(x.ptr()),
        KernelArg::Ptr(y.ptr()),
    ]
}

/// The scenario that crashed before the layer: one thread runs a long launch over a buffer
/// while another frees that buffer. Either the free comes first (the launch is then refused:
/// the buffer is gone) or the launch does (the free succeeds at once and the memory is released
/// when the launch has finished); never a crash. And deterministically: buffers freed right
/// after a launch and a read-back are queued give the right result.
#[test]
fn freeing_a_buffer_under_a_running_launch_waits_for_the_launch() {
    let rt = host_runtime();
    let device = rt.device("host", 0).unwrap();
    let program =
        offload_tests::load(&device, &std::fs::read(host_kernel("saxpy")).unwrap()).unwrap();
    let k = program.kernel("saxpy").unwrap();
    let n = 1 << 20;
    let dims = LaunchDims::linear((n / 256) as u32, 256);
    let (mut launched, mut refused) = (0, 0);
    for round in 0..20 {
        let x = device.alloc_buffer((n * 4) as u64).unwrap();
        let y = device.alloc_buffer((n * 4) as u64).unwrap();
        let args = saxpy_args(n, 2.0, &x, &y);
        let (xp, yp) = (x.ptr(), y.ptr());
        std::thread::scope(|s| {
            // SAFETY: the buffers are as long as the kernel touches for these arguments.
            let launcher = s.spawn(|| unsafe { k.launch(dims).args_raw(&args).unchecked().run() });
            std::thread::sleep(std::time::Duration::from_millis(round % 4));
            drop(x);
            drop(y);
            match launcher.join().unwrap() {
                Ok(()) => launched += 1,
                Err(e) => {
                    assert!(
                        e.to_string().contains("not inside any live allocation"),
                        "{e}"
                    );
                    refused += 1;
                }
            }
        });
        // The freed addresses are gone for new work.
        // SAFETY: the device API is used on this test's own allocations only, with no HostBuffer or safe-layer queue on them.
        let raw = unsafe { offload::raw::device(&device) };
        // SAFETY: already freed: the layer refuses them (what the test checks).
        assert!(unsafe { raw.free(xp).is_err() && raw.free(yp).is_err() });
    }
    println!(
        "{launched} launches ran over buffers freed under them, {refused} came after the free"
    );

    // Deterministic: the queue holds the buffers from the moment the work is accepted.
    // SAFETY: the device API is used on this test's own allocations only, with no HostBuffer or safe-layer queue on them.
    let raw = unsafe { offload::raw::device(&device) };
    let q = raw.queue_create().unwrap();
    let x = device.alloc_buffer((n * 4) as u64).unwrap();
    let y = device.alloc_buffer((n * 4) as u64).unwrap();
    x.write(&f32_bytes(&(0..n).map(|i| i as f32).collect::<Vec<_>>()))
        .unwrap();
    y.write(&f32_bytes(&vec![3.0; n])).unwrap();
    let mut out = vec![0u8; n * 4];
    // SAFETY: a test kernel on this test's own allocations, each as long as the kernel touches.
    unsafe { raw.launch(k.handle(), &dims, &saxpy_args(n, 2.0, &x, &y), Some(q)) }.unwrap();
    // SAFETY: `out` outlives the synchronize below.
    unsafe { raw.copy_from_device(out.as_mut_ptr(), y.ptr(), out.len(), Some(q)) }.unwrap();
    drop(x);
    drop(y);
    raw.queue_synchronize(q).unwrap();
    for (i, v) in f32s(&out).iter().enumerate().step_by(4099) {
        assert_eq!(*v, 2.0 * i as f32 + 3.0, "element {i}");
    }
    raw.queue_destroy(q).unwrap();
}

/// Several threads launch, copy and free at random for thousands of operations, sharing one
/// device and its queues' worker pool; buffers are freed while work that uses them is still
/// queued. No crash, and every result is checked.
#[test]
fn many_threads_launching_copying_and_freeing_at_random() {
    let rt = host_runtime();
    let device = rt.device("host", 0).unwrap();
    let program = Arc::new(
        offload_tests::load(&device, &std::fs::read(host_kernel("saxpy")).unwrap()).unwrap(),
    );
    let k = &program.kernel("saxpy").unwrap();
    let threads = 4;
    let iterations = 1000;
    std::thread::scope(|s| {
        for t in 0..threads {
            let device = device.clone();
            s.spawn(move || {
                // SAFETY: the device API is used on this test's own allocations only, with no HostBuffer or safe-layer queue on them.
                let raw = unsafe { offload::raw::device(&device) }.clone();
                let q = raw.queue_create().unwrap();
                let mut seq =
                    offload_core::rand::XorShift(0x9e37_79b9_7f4a_7c15u64 ^ (t as u64 + 1));
                let mut next = move || seq.next_u64();
                for i in 0..iterations {
                    let n = 1 + (next() % 3000) as usize;
                    let a = (next() % 7) as f32 - 3.0;
                    let xs: Vec<f32> = (0..n).map(|j| (j as f32) * 0.5 + i as f32).collect();
                    let ys: Vec<f32> = (0..n).map(|j| t as f32 - j as f32).collect();
                    let want: Vec<f32> = xs.iter().zip(&ys).map(|(x, y)| a * x + y).collect();
                    let (xb, yb) = (f32_bytes(&xs), f32_bytes(&ys));
                    let x = device.alloc_buffer((n * 4) as u64).unwrap();
                    let y = device.alloc_buffer((n * 4) as u64).unwrap();
                    let args = saxpy_args(n, a, &x, &y);
                    let dims = LaunchDims::linear(n.div_ceil(64) as u32, 64);
                    let mut out = vec![0u8; n * 4];
                    match next() % 3 {
                        0 => {
                            // Synchronous.
                            x.write(&xb).unwrap();
                            y.write(&yb).unwrap();
                            // SAFETY: the buffers are as long as the kernel touches for these arguments.
                            unsafe { k.launch(dims).args_raw(&args).unchecked().run() }.unwrap();
                            y.read(&mut out).unwrap();
                        }
                        1 => {
                            // Queued, and the buffers freed before the queue has run.
                            // SAFETY: the host buffers outlive the synchronize below.
                            unsafe {
                                raw.copy_to_device(x.ptr(), xb.as_ptr(), xb.len(), Some(q))
                                    .unwrap();
                                raw.copy_to_device(y.ptr(), yb.as_ptr(), yb.len(), Some(q))
                                    .unwrap();
                            }
                            // SAFETY: a test kernel on this test's own allocations, each as long as the kernel touches.
                            unsafe { raw.launch(k.handle(), &dims, &args, Some(q)) }.unwrap();
                            // SAFETY: as above.
                            unsafe {
                                raw.copy_from_device(out.as_mut_ptr(), y.ptr(), out.len(), Some(q))
                                    .unwrap();
                            }
                            drop(x);
                            drop(y);
                            raw.queue_synchronize(q).unwrap();
                        }
                        _ => {
                            // Mixed: data in synchronously, launch and read back queued, a
                            // device-to-device copy through a scratch buffer freed at once.
                            x.write(&xb).unwrap();
                            let scratch = device.alloc_buffer((n * 4) as u64).unwrap();
                            scratch.write(&yb).unwrap();
                            // SAFETY: both buffers are this thread's own, as long as the copy.
                            unsafe {
                                raw.copy_device_to_device(
                                    y.ptr(),
                                    scratch.ptr(),
                                    (n * 4) as u64,
                                    Some(q),
                                )
                            }
                            .unwrap();
                            drop(scratch);
                            // SAFETY: a test kernel on this test's own allocations, each as long as the kernel touches.
                            unsafe { raw.launch(k.handle(), &dims, &args, Some(q)) }.unwrap();
                            // SAFETY: `out` outlives the synchronize below.
                            unsafe {
                                raw.copy_from_device(out.as_mut_ptr(), y.ptr(), out.len(), Some(q))
                                    .unwrap();
                            }
                            drop(x);
                            drop(y);
                            raw.queue_synchronize(q).unwrap();
                        }
                    }
                    let got = f32s(&out);
                    for (j, (g, w)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(
                            g.to_bits(),
                            w.to_bits(),
                            "thread {t} iteration {i} element {j}"
                        );
                    }
                }
                raw.queue_destroy(q).unwrap();
            });
        }
    });
}

#[test]
fn events_order_work_across_queues_on_the_host() {
    let rt = host_runtime();
    let device = rt.device("host", 0).unwrap();
    let program =
        offload_tests::load(&device, &std::fs::read(host_kernel("saxpy")).unwrap()).unwrap();
    let k = program.kernel("saxpy").unwrap();
    // SAFETY: the device API is used on this test's own allocations only, with no HostBuffer or safe-layer queue on them.
    let raw = unsafe { offload::raw::device(&device) };
    let (producer, consumer) = (raw.queue_create().unwrap(), raw.queue_create().unwrap());
    let n = 1 << 20;
    let x = device.alloc_buffer((n * 4) as u64).unwrap();
    let y = device.alloc_buffer((n * 4) as u64).unwrap();
    let xb = f32_bytes(&(0..n).map(|i| i as f32).collect::<Vec<_>>());
    let yb = f32_bytes(&vec![1.0; n]);
    let ready = raw.event_create().unwrap();
    assert!(
        raw.event_query(ready).unwrap(),
        "a never-recorded event is complete"
    );
    let mut out = vec![0u8; n * 4];
    // SAFETY: the host buffers outlive the synchronizes below.
    unsafe {
        raw.copy_to_device(x.ptr(), xb.as_ptr(), xb.len(), Some(producer))
            .unwrap();
        raw.copy_to_device(y.ptr(), yb.as_ptr(), yb.len(), Some(producer))
            .unwrap();
    }
    for _ in 0..4 {
        // SAFETY: a test kernel on this test's own allocations, each as long as the kernel touches.
        unsafe {
            raw.launch(
                k.handle(),
                &LaunchDims::linear((n / 256) as u32, 256),
                &saxpy_args(n, 1.0, &x, &y),
                Some(producer),
            )
        }
        .unwrap();
    }
    raw.event_record(ready, producer).unwrap();
    raw.event_wait(ready, consumer).unwrap();
    // SAFETY: as above.
    unsafe {
        raw.copy_from_device(out.as_mut_ptr(), y.ptr(), out.len(), Some(consumer))
            .unwrap();
    }
    raw.queue_synchronize(consumer).unwrap();
    assert!(raw.event_query(ready).unwrap());
    raw.event_synchronize(ready).unwrap();
    let got = f32s(&out);
    for (i, g) in got.iter().enumerate().step_by(997) {
        assert_eq!(*g, 1.0 + 4.0 * i as f32, "element {i}");
    }
    raw.event_destroy(ready).unwrap();
    raw.queue_destroy(producer).unwrap();
    raw.queue_destroy(consumer).unwrap();
}

#[test]
fn overlapping_device_copies_give_memmove_results_on_the_host() {
    let rt = host_runtime();
    let device = rt.device("host", 0).unwrap();
    check_overlapping_device_copies(&device, 0xc0_9e11, 400);
}

#[test]
fn a_pointer_one_past_the_end_of_an_allocation_is_an_argument_of_it() {
    // `begin, end` parameters: end is one past the last element, and belongs to the same
    // allocation (kept alive with it); two past the end is outside, and refused on the host.
    let so = host_so(
        "fill-range",
        "#include \"offload_kernel.h\"\n\
         OFFLOAD_KERNEL void fill_range(unsigned *begin, unsigned *end) {\n\
           unsigned i = offload_global_id_x(); if (begin + i < end) begin[i] = 7; }\n",
    );
    let rt = host_runtime();
    let device = rt.device("host", 0).unwrap();
    let program = offload_tests::load(&device, &std::fs::read(so).unwrap()).unwrap();
    let k = program.kernel("fill_range").unwrap();
    let b = device.upload(&[0u32; 100]).unwrap();
    let end = |past: u64| KernelArg::Ptr(offload::DevicePtr(b.ptr().0 + 400 + past));
    // SAFETY: the kernel writes begin[0..end - begin), inside the buffer.
    unsafe {
        k.launch(LaunchDims::linear(1, 128))
            .args_raw(&[b.arg(), end(0)])
            .unchecked()
            .run()
    }
    .unwrap();
    assert_eq!(b.to_vec().unwrap(), vec![7u32; 100]);
    // SAFETY: refused before anything runs.
    let e = unsafe {
        k.launch(LaunchDims::linear(1, 128))
            .args_raw(&[b.arg(), end(4)])
            .unchecked()
            .run()
    }
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("argument 1") && e.contains("not inside any live allocation"),
        "{e}"
    );
}
