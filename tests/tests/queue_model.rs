//! Seeded random mixes of queued and synchronous operations (copies in and out, device
//! copies, launches, fills, scoped reads, events between queues) on buffers that several
//! threads share, each thread on its own range of every buffer, every read compared with a
//! model: no read sees memory from before work queued earlier, no write is lost.

use offload::{DeviceBuffer, LaunchDims};
use offload_core::rand::XorShift;
use offload_tests::*;

const BUFFERS: usize = 3;
const THREADS: usize = 3;
const RANGE: usize = 512;

/// `add_k`: x[i] += k on x[0..n).
fn kernel_so() -> std::path::PathBuf {
    host_so(
        "queue-model-add-k",
        "#include \"offload_kernel.h\"\n\
         OFFLOAD_KERNEL void add_k(int n, unsigned k, unsigned *x) {\n\
           unsigned i = offload_global_id_x(); if (i < (unsigned)n) x[i] += k; }\n\
         OFFLOAD_PARAMS(add_k, int n, unsigned k, unsigned x[n]);\n",
    )
}

#[test]
fn random_queued_and_synchronous_work_on_shared_buffers_matches_a_model() {
    let rt = host_runtime();
    let device = rt.device("host", 0).unwrap();
    let program = device.load(&std::fs::read(kernel_so()).unwrap()).unwrap();
    let add = program.kernel("add_k").unwrap();
    let bufs: Vec<DeviceBuffer<u32>> = (0..BUFFERS)
        .map(|_| device.upload(&vec![0u32; RANGE * THREADS]).unwrap())
        .collect();
    let models: Vec<Vec<Vec<u32>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (device, bufs, add) = (&device, &bufs, &add);
                s.spawn(move || {
                    let mut rng = XorShift(0x9e37_79b9 ^ (t as u64 * 0x1234_5678_9abc));
                    let mut model = vec![vec![0u32; RANGE]; BUFFERS];
                    let queues = [device.queue().unwrap(), device.queue().unwrap()];
                    let mut current = 0usize;
                    let base = t * RANGE;
                    for step in 0..200 {
                        let b = (rng.next_u64() % BUFFERS as u64) as usize;
                        let lo = (rng.next_u64() % RANGE as u64) as usize;
                        let len = 1 + (rng.next_u64() % (RANGE - lo) as u64) as usize;
                        let range = base + lo..base + lo + len;
                        let view = bufs[b].slice(range.clone()).unwrap();
                        let what = rng.next_u64() % 10;
                        // Queued work goes to one of two queues; moving to the other one is
                        // ordered by an event, as a program must.
                        if what >= 5 && rng.next_u64() % 4 == 0 {
                            let done = queues[current].record().unwrap();
                            current ^= 1;
                            queues[current].wait(&done).unwrap();
                        }
                        let q = &queues[current];
                        let ctx = format!("thread {t} step {step} op {what} buffer {b} {range:?}");
                        match what {
                            0 => {
                                let v: Vec<u32> = (0..len).map(|_| rng.next_u64() as u32).collect();
                                view.write(&v).unwrap();
                                model[b][lo..lo + len].copy_from_slice(&v);
                            }
                            1 | 2 => {
                                let mut got = vec![0u32; len];
                                view.read(&mut got).unwrap();
                                assert_eq!(got, model[b][lo..lo + len], "{ctx}: synchronous read");
                            }
                            3 => {
                                let v = rng.next_u64() as u32;
                                view.fill(v).unwrap();
                                model[b][lo..lo + len].fill(v);
                            }
                            4 => {
                                // Synchronous launch on this thread's range of a shared buffer.
                                let k = rng.next_u64() as u32 % 1000;
                                // SAFETY: add_k touches x[0..n) and the view holds n elements;
                                // no other thread uses this range.
                                unsafe {
                                    add.launch(LaunchDims::for_elems(len as u64, 64).unwrap())
                                        .arg(len as i32)
                                        .arg(k)
                                        .arg(view)
                                        .run_unchecked()
                                }
                                .unwrap();
                                for v in &mut model[b][lo..lo + len] {
                                    *v = v.wrapping_add(k);
                                }
                            }
                            5 => {
                                let v: Vec<u32> = (0..len).map(|_| rng.next_u64() as u32).collect();
                                model[b][lo..lo + len].copy_from_slice(&v);
                                q.upload(view, v).unwrap();
                            }
                            6 => {
                                let k = rng.next_u64() as u32 % 1000;
                                add.launch(LaunchDims::for_elems(len as u64, 64).unwrap())
                                    .arg(len as i32)
                                    .arg(k)
                                    .arg(view)
                                    .run_on(q)
                                    .unwrap();
                                for v in &mut model[b][lo..lo + len] {
                                    *v = v.wrapping_add(k);
                                }
                            }
                            7 => {
                                // A queued device copy from another buffer's same range.
                                let from = (b + 1) % BUFFERS;
                                q.copy(view, bufs[from].slice(range.clone()).unwrap())
                                    .unwrap();
                                let src = model[from][lo..lo + len].to_vec();
                                model[b][lo..lo + len].copy_from_slice(&src);
                            }
                            8 => {
                                let mut got = vec![0u32; len];
                                q.scope(|s| s.read(&mut got, view)).unwrap();
                                assert_eq!(got, model[b][lo..lo + len], "{ctx}: queued read");
                            }
                            _ => {
                                // A synchronous device copy into this range.
                                let from = (b + 2) % BUFFERS;
                                view.copy_from(bufs[from].slice(range.clone()).unwrap())
                                    .unwrap();
                                let src = model[from][lo..lo + len].to_vec();
                                model[b][lo..lo + len].copy_from_slice(&src);
                            }
                        }
                    }
                    for q in &queues {
                        q.synchronize().unwrap();
                    }
                    model
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Nothing lost: every buffer is every thread's model, side by side.
    for (b, buf) in bufs.iter().enumerate() {
        let got = buf.to_vec().unwrap();
        for (t, model) in models.iter().enumerate() {
            assert_eq!(
                got[t * RANGE..(t + 1) * RANGE],
                model[b][..],
                "buffer {b}, thread {t}'s range at the end"
            );
        }
    }
}
