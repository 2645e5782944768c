//! The drop-in libomptarget against Debian's LLVM 19 libomptarget, in one run: one OpenMP
//! program (`tests/benches/peers/omp_bench.c`, built once by clang-19 against Debian's
//! library) runs on each library in turn, round after round (the order alternates). Prints,
//! per case, the median seconds per construct on each and the ratio ours/Debian (median over
//! rounds, and its range). Then the start of a one-region program: built AOT on both, and
//! built with `-fopenmp-target-jit` on ours, with an empty JIT disk cache (cold) and again
//! (warm); Debian's library cannot run JIT-mode programs at all.
//!
//!     scripts/bench-omp.sh                      (builds in release, then runs this)
//!     cargo bench -p offload-tests --bench omp_vs_debian
//!
//! `OFFLOAD_BENCH_ROUNDS` sets the rounds (default 5). Needs the workspace built in release
//! (`cargo build --release --workspace`), clang-19 and libomp-19-dev.

use offload_tests::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

const DEBIAN: &str = "/usr/lib/llvm-19/lib";

fn build(src: &Path, out: &Path, extra: &[&str]) {
    let mut args = vec![
        "-O2",
        "-fopenmp",
        "-fopenmp-targets=x86_64-pc-linux-gnu",
        src.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ];
    let l = format!("-L{DEBIAN}");
    args.push(&l);
    args.extend(extra);
    clang(&args);
}

/// Runs `program` with the libomptarget in `lib`; its standard output.
fn run(program: &Path, lib: &str, args: &[&str], envs: &[(&str, &str)]) -> String {
    let out = Command::new(program)
        .args(args)
        .env("LD_LIBRARY_PATH", lib)
        .env_remove("LIBOMPTARGET_INFO")
        .env_remove("OFFLOAD_INFO")
        .envs(envs.iter().copied())
        .output()
        .expect("run the benchmark program");
    assert!(
        out.status.success(),
        "{} on {lib}: {:?}\n{}",
        program.display(),
        out.status,
        stderr(&out)
    );
    stdout(&out)
}

fn cases(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some("case")).then(|| {
                let name = w.next().expect("name").to_string();
                let secs: f64 = w.next().expect("time").parse().expect("seconds");
                (name, secs)
            })
        })
        .collect()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn shown(secs: f64) -> String {
    if secs < 1e-3 {
        format!("{:8.2} us", secs * 1e6)
    } else {
        format!("{:8.2} ms", secs * 1e3)
    }
}

/// Wall time of one run, in seconds.
fn wall(program: &Path, lib: &str, envs: &[(&str, &str)]) -> f64 {
    let t = Instant::now();
    run(program, lib, &[], envs);
    t.elapsed().as_secs_f64()
}

fn main() {
    let ours = omptarget_dir();
    let ours = ours.to_str().unwrap().to_string();
    let rounds: usize = std::env::var("OFFLOAD_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(5);
    let dir = scratch("omp-bench");
    let src = repo_root().join("tests/benches/peers/omp_bench.c");
    let program = dir.join("omp_bench");
    build(&src, &program, &[]);

    // (case -> per-round seconds) for each library, and per-round ratios.
    let mut deb: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut our: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    for round in 0..rounds {
        let libs: [(&str, &mut BTreeMap<String, Vec<f64>>); 2] = if round % 2 == 0 {
            [(DEBIAN, &mut deb), (&ours, &mut our)]
        } else {
            [(&ours, &mut our), (DEBIAN, &mut deb)]
        };
        for (lib, into) in libs {
            for (name, secs) in cases(&run(&program, lib, &[], &[])) {
                if !order.contains(&name) {
                    order.push(name.clone());
                }
                into.entry(name).or_default().push(secs);
            }
        }
        eprintln!("omp bench: round {} of {rounds} done", round + 1);
    }
    let date = Command::new("date")
        .arg("+%Y-%m-%d")
        .output()
        .map(|o| stdout(&o).trim().to_string())
        .unwrap_or_default();
    println!(
        "drop-in libomptarget vs Debian's LLVM 19 libomptarget, {rounds} rounds, {date} \
         (cargo bench -p offload-tests --bench omp_vs_debian)"
    );
    println!(
        "{:<20} {:>12} {:>12} {:>10} {:>16}",
        "case", "Debian", "offload", "ratio", "range"
    );
    for name in &order {
        let (d, o) = (&deb[name], &our[name]);
        let mut ratios: Vec<f64> = d.iter().zip(o).map(|(d, o)| o / d).collect();
        let lo = ratios.iter().copied().fold(f64::MAX, f64::min);
        let hi = ratios.iter().copied().fold(0.0, f64::max);
        println!(
            "{name:<20} {:>12} {:>12} {:>9.2}x {:>7.2}-{:<7.2}",
            shown(median(&mut d.clone())),
            shown(median(&mut o.clone())),
            median(&mut ratios),
            lo,
            hi
        );
    }

    // Start of a one-region program: AOT on both, JIT-mode on ours (cold, then warm cache).
    let start_src = dir.join("start.c");
    std::fs::write(
        &start_src,
        "int main(void) { int x = 0;\n#pragma omp target map(tofrom: x)\n x += 1;\n return x != 1; }\n",
    )
    .unwrap();
    let aot = dir.join("start-aot");
    let jit = dir.join("start-jit");
    build(&start_src, &aot, &[]);
    build(&start_src, &jit, &["-fopenmp-target-jit"]);
    let (mut t_deb, mut t_ours, mut t_cold, mut t_warm) = (vec![], vec![], vec![], vec![]);
    for round in 0..rounds {
        let cache = dir.join(format!("jit-cache-{round}"));
        let envs = [
            ("OFFLOAD_CACHE", "1"),
            ("OFFLOAD_CACHE_DIR", cache.to_str().unwrap()),
        ];
        t_deb.push(wall(&aot, DEBIAN, &[]));
        t_ours.push(wall(&aot, &ours, &[]));
        t_cold.push(wall(&jit, &ours, &envs));
        t_warm.push(wall(&jit, &ours, &envs));
    }
    let d = median(&mut t_deb);
    println!("program start, one target region (wall time of the process, median of {rounds}):");
    println!("  AOT on Debian's library      {}", shown(d));
    for (label, v) in [
        ("AOT on offload              ", &mut t_ours),
        ("JIT mode on offload, cold   ", &mut t_cold),
        ("JIT mode on offload, warm   ", &mut t_warm),
    ] {
        let m = median(v);
        println!("  {label} {}  ({:.2}x Debian's AOT)", shown(m), m / d);
    }
    println!("  JIT mode on Debian's library: fails at the first target region (no JIT targets)");
}
