//! 10,000 load/unload cycles of a cached bitcode image: resident memory grows by less than
//! 2 MiB (no per-load leak in the cache, the loader, the memfd path or the plugin's tables).

use offload_tests::*;

#[test]
fn ten_thousand_cached_load_unload_cycles_keep_memory_flat() {
    let rt = host_runtime();
    let device = rt.device("host", 0).unwrap();
    let slot = rt.plugin("host").unwrap();
    let bitcode = std::fs::read(host_bitcode("saxpy")).unwrap();
    let cycle = || {
        let program = offload_tests::load(&device, &bitcode).unwrap();
        program.kernel("saxpy").unwrap();
    };
    // Warm up: the first compile, the loader's caches, the allocator's arenas.
    for _ in 0..500 {
        cycle();
    }
    let before = resident_bytes();
    for _ in 0..10_000 {
        cycle();
    }
    let after = resident_bytes();
    let st = slot.jit_stats().unwrap();
    assert_eq!(st.compiles, 1, "{st:?}");
    assert_eq!(st.memory_hits, 10_499);
    let growth = after.saturating_sub(before);
    println!("resident before {before} B, after {after} B, growth {growth} B");
    assert!(
        growth < 2 << 20,
        "resident memory grew by {growth} bytes over 10,000 cycles"
    );
}
