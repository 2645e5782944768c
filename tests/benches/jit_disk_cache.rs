//! The disk cache's effect on a fresh process, in one run: the time from starting `offload` to
//! its end, with an empty cache directory (cold: the process starts the JIT worker and compiles)
//! and with the entry already there (warm: no worker, no LLVM), for host, nvptx64 and amdgcn
//! bitcode of the same saxpy kernel. Host: `offload run` (a finished kernel). nvptx64 and
//! amdgcn: `offload jit` (the image the CUDA or AMD plugin would load: a cubin when `ptxas` is
//! on PATH, else PTX; an AMD code object), since this machine may have no GPU to finish a kernel
//! on. Each time is the median of interleaved cold and warm rounds; `OFFLOAD_BENCH_ROUNDS` sets
//! their number (7 by default).
//!
//! Then, host plugin only, `offload info` with a cache of 1,000 entries against `OFFLOAD_CACHE=0`
//! (info counts the entries from the directory listing: no `stat`, no read), and `offload cache
//! stats`, which stats every file and reads every entry's magic (what `info` did before),
//! interleaved, with the ranges of the ratios.
//!
//!     cargo build --release --workspace && cargo bench -p offload-tests --bench jit_disk_cache

use offload_tests::*;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs `offload ARGS` with the cache in `dir`; returns the wall time in ms and the JSON.
fn timed(args: &[&str], dir: &Path) -> (f64, serde_json::Value) {
    timed_with(args, dir, "1", "host,cuda,amdgpu")
}

/// [`timed`] with `OFFLOAD_CACHE=cache` and `OFFLOAD_PLUGINS=plugins`.
fn timed_with(args: &[&str], dir: &Path, cache: &str, plugins: &str) -> (f64, serde_json::Value) {
    let t = Instant::now();
    let o = Command::new(offload_bin())
        .args(args)
        .env("OFFLOAD_CACHE", cache)
        .env("OFFLOAD_CACHE_DIR", dir)
        .env("OFFLOAD_PLUGINS", plugins)
        .output()
        .expect("run offload");
    let ms = t.elapsed().as_secs_f64() * 1e3;
    assert!(
        o.status.success(),
        "offload {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    (ms, serde_json::from_slice(&o.stdout).unwrap())
}

fn main() {
    let rounds: usize = std::env::var("OFFLOAD_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(7);
    let scratch = scratch("bench-disk-cache");
    let host = host_bitcode("saxpy");
    let nvptx = nvptx_bitcode("saxpy", "sm_90");
    let amd = amdgcn_bitcode("saxpy", "gfx90a");
    let out = scratch.join("image.out");
    let dump = scratch.join("dump");
    std::fs::create_dir_all(&dump).unwrap();
    let host_args = saxpy_run_args(&host);
    let jit_args = |input: &Path, target: &str, cpu: &str| -> Vec<String> {
        [
            "jit",
            input.to_str().unwrap(),
            "--target",
            target,
            "--cpu",
            cpu,
            "-o",
            out.to_str().unwrap(),
            "--json",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let cases: Vec<(&str, Vec<String>)> = vec![
        ("host x86-64, offload run (finished kernel)", host_args),
        (
            "nvptx64 sm_90, offload jit (loadable image)",
            jit_args(&nvptx, NVPTX, "sm_90"),
        ),
        (
            "amdgcn gfx90a, offload jit (code object)",
            jit_args(&amd, "amdgcn-amd-amdhsa", "gfx90a"),
        ),
    ];
    println!(
        "JIT disk cache: a fresh `offload` process, cold (empty cache: worker + compile) and warm \
         (entry on disk: no worker, no LLVM); median of {rounds} interleaved rounds"
    );
    println!(
        "{:<46} {:>10} {:>10} {:>11}  warm process",
        "case", "cold", "warm", "warm/cold"
    );
    for (label, args) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (mut cold, mut warm) = (Vec::new(), Vec::new());
        let warm_dir = scratch.join(format!("warm-{}", label.len()));
        let _ = std::fs::remove_dir_all(&warm_dir);
        timed(&args, &warm_dir); // fills it
        let mut last = serde_json::Value::Null;
        for r in 0..rounds {
            let cold_dir = scratch.join(format!("cold-{r}"));
            let _ = std::fs::remove_dir_all(&cold_dir);
            cold.push(timed(&args, &cold_dir).0);
            let _ = std::fs::remove_dir_all(&cold_dir);
            let (ms, json) = timed(&args, &warm_dir);
            warm.push(ms);
            last = json;
        }
        // What the warm process did (served from the disk, started no worker).
        let how = if args[0] == "run" {
            format!(
                "disk hits {}, compiles {}, worker started: {}",
                last["jit"]["disk_hits"], last["jit"]["compiles"], last["jit"]["worker_started"]
            )
        } else {
            format!("served: {}", last["served"])
        };
        let (c, w) = (median(cold), median(warm));
        println!("{label:<46} {c:>8.1}ms {w:>8.1}ms {:>10.3}x  {how}", w / c);
    }
    info_with_many_entries(&scratch, rounds.max(15));
}

/// `offload info` with 1,000 entries in the cache against the cache turned off.
fn info_with_many_entries(scratch: &Path, rounds: usize) {
    let args = ["info", "--json"];
    const ENTRIES: usize = 1000;
    let dir = scratch.join("many-entries");
    let _ = std::fs::remove_dir_all(&dir);
    let host = host_bitcode("saxpy");
    let run = [
        "run",
        host.to_str().unwrap(),
        "--kernel",
        "saxpy",
        "--arg",
        "i32:1",
        "--arg",
        "f32:1",
        "--arg",
        "buf:f32:1",
        "--arg",
        "buf:f32:1",
        "--json",
    ];
    timed(&run, &dir);
    let entry = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "entry"))
        .expect("an entry was written");
    let bytes = std::fs::read(&entry).unwrap();
    for i in 1..ENTRIES {
        std::fs::write(
            dir.join(format!("{:064x}.entry", i as u128 * 0x9e37_79b9)),
            &bytes,
        )
        .unwrap();
    }
    let (mut on, mut off, mut stats) = (Vec::new(), Vec::new(), Vec::new());
    let mut counted = serde_json::Value::Null;
    for _ in 0..rounds {
        let (a, json) = timed_with(&args, &dir, "1", "host");
        let (b, _) = timed_with(&args, &dir, "0", "host");
        let (c, _) = timed_with(&["cache", "stats", "--json"], &dir, "1", "host");
        counted = json["jit"]["disk_cache"]["entries"].clone();
        on.push(a);
        off.push(b);
        stats.push(c);
    }
    let ratio = |x: &[f64], y: &[f64]| {
        let r: Vec<f64> = x.iter().zip(y).map(|(a, b)| a / b).collect();
        let (lo, hi) = r
            .iter()
            .fold((f64::MAX, f64::MIN), |(l, h), v| (l.min(*v), h.max(*v)));
        format!("{:.2}x (range {lo:.2}-{hi:.2}x)", median(r))
    };
    println!(
        "host plugin only, {ENTRIES} entries ({counted} counted), median of {rounds} interleaved rounds:"
    );
    println!(
        "  offload info {:.1}ms vs OFFLOAD_CACHE=0 {:.1}ms: {}",
        median(on.clone()),
        median(off.clone()),
        ratio(&on, &off)
    );
    println!(
        "  offload cache stats (a stat and a read per entry) {:.1}ms: {} of info",
        median(stats.clone()),
        ratio(&stats, &on)
    );
}
