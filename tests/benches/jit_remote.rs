//! The remote cache's effect on a fresh process with an empty disk cache (a new node, a CI
//! runner), in one run against a `redis-server` the bench starts on a unix socket: the time
//! from starting `offload` to its end when nothing is cached (cold: no remote; the worker
//! starts and compiles), when the remote holds the image (warm: a remote hit, no worker, no
//! LLVM), and when the remote is empty (a miss: the lookup, the lock, the compile, the store),
//! against a disk hit (the floor: a fresh process that finds the image on its own disk),
//! for host bitcode (`offload run` of saxpy) and nvptx64 bitcode (`offload jit`, the image the
//! CUDA plugin would load). Rounds interleave the three; `OFFLOAD_BENCH_ROUNDS` sets their
//! number (7 by default). Ratios against the cold time of the same round, median [min..max].
//!
//!     cargo build --release --workspace && cargo bench -p offload-tests --bench jit_remote

use offload_tests::*;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

fn summary(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// `offload ARGS` with an empty disk cache in `disk` and the remote `url` (or none); the wall
/// time in ms and how the image was served.
fn timed(args: &[String], disk: &Path, url: Option<&str>) -> (f64, String) {
    let _ = std::fs::remove_dir_all(disk);
    timed_keeping(args, disk, url)
}

/// [`timed`] with the disk cache as it is.
fn timed_keeping(args: &[String], disk: &Path, url: Option<&str>) -> (f64, String) {
    let mut cmd = Command::new(offload_bin());
    cmd.args(args)
        .env("OFFLOAD_CACHE", "1")
        .env("OFFLOAD_CACHE_DIR", disk)
        .env("OFFLOAD_PLUGINS", "host,cuda")
        .env_remove("OFFLOAD_CACHE_REMOTE");
    if let Some(u) = url {
        cmd.env("OFFLOAD_CACHE_REMOTE", u);
    }
    let t = Instant::now();
    let o = cmd.output().expect("run offload");
    let ms = t.elapsed().as_secs_f64() * 1e3;
    assert!(
        o.status.success(),
        "offload {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let served = if v["served"].is_string() {
        v["served"].as_str().unwrap().to_string()
    } else if v["jit"]["disk_hits"].as_u64() == Some(1) {
        "disk".into()
    } else if v["jit"]["remote_hits"].as_u64() == Some(1) {
        "remote".into()
    } else if v["jit"]["compiles"].as_u64() == Some(1) {
        "compiled".into()
    } else {
        format!("{}", v["jit"])
    };
    (ms, served)
}

fn main() {
    let rounds: usize = std::env::var("OFFLOAD_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(7);
    let scratch = scratch("bench-remote");
    let redis = Redis::start("bench", &[]);
    let disk = scratch.join("disk");
    let host = host_bitcode("saxpy");
    let nvptx = nvptx_bitcode("saxpy", "sm_90");
    let out = scratch.join("image.out");
    let host_args = saxpy_run_args(&host);
    let nvptx_args: Vec<String> = [
        "jit",
        nvptx.to_str().unwrap(),
        "--target",
        NVPTX,
        "--cpu",
        "sm_90",
        "-o",
        out.to_str().unwrap(),
        "--json",
    ]
    .map(String::from)
    .to_vec();
    println!(
        "jit_remote: a fresh process with an empty disk cache, {rounds} rounds, {} (redis-server \
         on a unix socket); ratios against the cold time of each round, median [min..max]",
        redis.url
    );
    println!(
        "{:>8}  {:>9} {:>9} {:>9} {:>9}  {:>22} {:>22} {:>22}",
        "image",
        "cold ms",
        "remote ms",
        "miss ms",
        "disk ms",
        "remote hit / cold",
        "remote miss / cold",
        "disk hit / cold"
    );
    for (name, args) in [("host", &host_args), ("nvptx64", &nvptx_args)] {
        let (mut cold, mut warm, mut miss) = (Vec::new(), Vec::new(), Vec::new());
        let (mut hit_ratio, mut miss_ratio) = (Vec::new(), Vec::new());
        let (mut disk_ms, mut disk_ratio) = (Vec::new(), Vec::new());
        // One run to warm the page cache and fill nothing.
        timed(args, &disk, None);
        for _ in 0..rounds {
            let (c, served) = timed(args, &disk, None);
            assert_eq!(served, "compiled", "cold {name}");
            redis.cli(&["FLUSHALL"]);
            let (m, served) = timed(args, &disk, Some(&redis.url));
            assert_eq!(served, "compiled", "miss {name}");
            let (w, served) = timed(args, &disk, Some(&redis.url));
            assert_eq!(served, "remote", "warm {name}");
            // The remote's hit was written to the disk: the next process reads it there.
            let (d, served) = timed_keeping(args, &disk, None);
            assert_eq!(served, "disk", "disk {name}");
            disk_ms.push(d);
            disk_ratio.push(d / c);
            cold.push(c);
            warm.push(w);
            miss.push(m);
            hit_ratio.push(w / c);
            miss_ratio.push(m / c);
        }
        let (h, h0, h1) = summary(hit_ratio);
        let (m, m0, m1) = summary(miss_ratio);
        let (d, d0, d1) = summary(disk_ratio);
        println!(
            "{name:>8}  {:>9.1} {:>9.1} {:>9.1} {:>9.1}  {:>22} {:>22} {:>22}",
            summary(cold).0,
            summary(warm).0,
            summary(miss).0,
            summary(disk_ms).0,
            format!("{h:.3} [{h0:.3}..{h1:.3}]"),
            format!("{m:.3} [{m0:.3}..{m1:.3}]"),
            format!("{d:.3} [{d0:.3}..{d1:.3}]"),
        );
    }
}
