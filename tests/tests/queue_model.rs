//! Seeded random mixes of queued and synchronous operations (copies in and out, device
//! copies, launches, fills, scoped reads, events between queues) on buffers that several
//! threads share, each thread on its own range of every buffer, every read compared with a
//! model: no read sees memory from before work queued earlier, no write is lost. The same
//! check runs on the fake CUDA driver and HSA runtime (`check_random_queued_work`).

use offload_tests::*;

#[test]
fn random_queued_and_synchronous_work_on_shared_buffers_matches_a_model() {
    let rt = host_runtime();
    let device = rt.device("host", 0).unwrap();
    let program =
        offload_tests::load(&device, &std::fs::read(host_kernel("add_k")).unwrap()).unwrap();
    let add = program.kernel("add_k").unwrap();
    check_random_queued_work(&device, &add, 0);
}
