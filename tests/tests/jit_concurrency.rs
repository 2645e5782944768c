//! 16 threads × 4 host devices of one compute-unit kind load the same bitcode at once: exactly
//! one compile, and every launch computes the right result.
//!
//! Its own test binary, because it sets OFFLOAD_HOST_DEVICES before the plugin initialises.

use offload::{KernelArg, LaunchDims};
use offload_tests::*;

#[test]
fn sixteen_threads_on_four_devices_compile_the_same_bitcode_once() {
    // SAFETY: set before any other thread of this test binary exists and before the plugin
    // reads it; this binary has no other test.
    unsafe { std::env::set_var("OFFLOAD_HOST_DEVICES", "4") };
    let rt = host_runtime();
    let slot = rt.plugin("host").unwrap();
    assert_eq!(slot.device_count().unwrap(), 4);
    let kinds: Vec<String> = (0..4)
        .map(|i| slot.device(i).unwrap().info().unwrap().compute_unit_kind)
        .collect();
    assert!(
        kinds.iter().all(|k| *k == kinds[0]),
        "one compute-unit kind: {kinds:?}"
    );
    let bitcode = std::fs::read(host_bitcode("saxpy")).unwrap();
    let n = 4099usize;
    let barrier = std::sync::Barrier::new(16);
    std::thread::scope(|s| {
        for t in 0..16usize {
            let (bitcode, barrier, rt) = (&bitcode, &barrier, &rt);
            s.spawn(move || {
                let device = rt.device("host", t % 4).unwrap();
                // Each thread loads from its own copy: equal contents, different addresses.
                let mine = bitcode.clone();
                barrier.wait();
                let program = offload_tests::load(&device, &mine).unwrap();
                let k = program.kernel("saxpy").unwrap();
                let x = device.alloc_buffer((n * 4) as u64).unwrap();
                let y = device.alloc_buffer((n * 4) as u64).unwrap();
                x.write(&f32_bytes(&(0..n).map(|i| i as f32).collect::<Vec<_>>()))
                    .unwrap();
                y.write(&f32_bytes(&vec![t as f32; n])).unwrap();
                // SAFETY: the buffers are as long as the kernel touches for these arguments.
                unsafe {
                    k.launch(LaunchDims::linear(n.div_ceil(64) as u32, 64))
                        .args_raw(&[
                            KernelArg::I32(n as i32),
                            KernelArg::F32(2.0),
                            KernelArg::Ptr(x.ptr()),
                            KernelArg::Ptr(y.ptr()),
                        ])
                        .unchecked()
                        .run()
                }
                .unwrap();
                let mut raw = vec![0u8; n * 4];
                y.read(&mut raw).unwrap();
                for (i, c) in raw.chunks_exact(4).enumerate() {
                    assert_eq!(
                        f32::from_le_bytes(c.try_into().unwrap()),
                        2.0 * i as f32 + t as f32
                    );
                }
            });
        }
    });
    let st = slot.jit_stats().unwrap();
    assert_eq!(st.compiles, 1, "{st:?}");
    assert_eq!(st.misses, 1, "{st:?}");
    assert_eq!(st.memory_hits + st.shared_waits, 15, "{st:?}");
    assert_eq!(st.failures, 0);
}
