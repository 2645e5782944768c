//! The host backend against its peers, in one run: each kernel on offload's host plugin from a
//! shared object (direct calls per work item) and from bitcode (the JIT's work-group
//! functions), on PoCL (OpenCL C versions of the same kernels, same inputs, same decomposition:
//! `tests/benches/peers/pocl_runner.c`), and as native OpenMP loops (`clang-19 -O3
//! -march=native -fopenmp`: `tests/benches/peers/omp_runner.c`). Prints per-kernel medians and
//! the ratios offload/PoCL and offload/native, and checks that every result is equal, bit for
//! bit, across all of them.
//!
//!     scripts/bench-host-peers.sh        (installs PoCL and libomp if missing, then runs this)
//!     cargo bench -p offload-tests --bench host_peers [-- WORD...]
//!
//! `OFFLOAD_BENCH_THREADS` (default `1,<cores>`) lists the thread counts, each measured in a
//! process of its own with every runtime set to it; `OFFLOAD_BENCH_ROUNDS` (default 5) the rounds.
//! Each ratio is given with its range over the rounds, each runtime with the spread of its
//! launches inside a process (median / fastest).
//!
//! Needs the workspace built in release (`cargo build --release --workspace`).

use offload::{KernelArg, LaunchDims};
use offload_tests::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

struct Case {
    label: &'static str,
    kernel: &'static str,
    symbol: &'static str,
    size: u64,
    grid: [u32; 3],
    block: [u32; 3],
    reps: usize,
    /// Per-launch time in microseconds rather than milliseconds.
    micro: bool,
}

fn cases() -> Vec<Case> {
    let lin = |n: u64, b: u32| [n.div_ceil(u64::from(b)) as u32, 1, 1];
    vec![
        Case {
            label: "saxpy f32, 1M, block 256",
            kernel: "saxpy",
            symbol: "saxpy",
            size: 1 << 20,
            grid: lin(1 << 20, 256),
            block: [256, 1, 1],
            reps: 41,
            micro: false,
        },
        Case {
            label: "saxpy f32, 16M",
            kernel: "saxpy",
            symbol: "saxpy",
            size: 16 << 20,
            grid: lin(16 << 20, 256),
            block: [256, 1, 1],
            reps: 11,
            micro: false,
        },
        Case {
            label: "7-point stencil, 128^3 f64",
            kernel: "stencil7",
            symbol: "stencil7",
            size: 128,
            grid: [1, 128, 128],
            block: [128, 1, 1],
            reps: 11,
            micro: false,
        },
        Case {
            label: "histogram, 16M, 256 bins, atomics",
            kernel: "hist",
            symbol: "hist",
            size: 16 << 20,
            grid: lin(16 << 20, 256),
            block: [256, 1, 1],
            reps: 5,
            micro: false,
        },
        Case {
            label: "matmul f32 512^2, item per element",
            kernel: "matmul",
            symbol: "matmul",
            size: 512,
            grid: [32, 32, 1],
            block: [16, 16, 1],
            reps: 5,
            micro: false,
        },
        Case {
            label: "block reduction (barriers), 16M",
            kernel: "reduce",
            symbol: "block_sum",
            size: 16 << 20,
            grid: lin(16 << 20, 512),
            block: [256, 1, 1],
            reps: 5,
            micro: false,
        },
        Case {
            label: "empty kernel, grid 1 x block 1",
            kernel: "empty",
            symbol: "empty",
            size: 1,
            grid: [1, 1, 1],
            block: [1, 1, 1],
            reps: 2001,
            micro: true,
        },
        Case {
            label: "empty kernel, 10M work items",
            kernel: "empty",
            symbol: "empty",
            size: 10_000_128,
            grid: [39063, 1, 1],
            block: [256, 1, 1],
            reps: 11,
            micro: false,
        },
    ]
}

/// The inputs, by the formulas of `peers/inputs.h`.
fn buffers(c: &Case) -> (Vec<Vec<u8>>, usize) {
    let n = c.size;
    let f32s = |f: &dyn Fn(u64) -> f32, len: u64| {
        (0..len)
            .flat_map(|i| f(i).to_le_bytes())
            .collect::<Vec<u8>>()
    };
    let u32s = |f: &dyn Fn(u64) -> u32, len: u64| {
        (0..len)
            .flat_map(|i| f(i).to_le_bytes())
            .collect::<Vec<u8>>()
    };
    match c.kernel {
        "saxpy" => (
            vec![
                f32s(&|i| (i % 1000) as f32 * 0.5, n),
                f32s(&|i| 1.0 - (i % 77) as f32, n),
            ],
            1,
        ),
        "stencil7" => {
            let cells = n * n * n;
            let input: Vec<u8> = (0..cells)
                .flat_map(|i| ((i % 100) as f64 * 0.01).to_le_bytes())
                .collect();
            (vec![input, vec![0; cells as usize * 8]], 1)
        }
        "hist" => (
            vec![u32s(&|i| (i * 7 + (i >> 5)) as u32, n), vec![0; 256 * 4]],
            1,
        ),
        "matmul" => (
            vec![
                f32s(&|i| (i % 7) as f32 - 3.0, n * n),
                f32s(&|i| (i % 5) as f32 * 0.5, n * n),
                vec![0; (n * n) as usize * 4],
            ],
            2,
        ),
        "reduce" => (
            vec![
                u32s(&|i| (i % 1000) as u32, n),
                vec![0; n.div_ceil(512) as usize * 4],
            ],
            1,
        ),
        _ => (vec![], usize::MAX),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One runtime's times in one round: the median and the fastest of its repeated launches.
#[derive(Debug, Clone, Copy)]
struct Timing {
    median: f64,
    min: f64,
}

/// Runs `c` on the host plugin from `image`: its timing and the result buffer after the first
/// launch.
fn offload_run(rt: &offload::Runtime, image: &Path, c: &Case) -> (Timing, Vec<u8>) {
    let device = rt.device("host", 0).unwrap();
    let program = offload_tests::load(&device, &std::fs::read(image).unwrap()).unwrap();
    let kernel = program.kernel(c.symbol).unwrap();
    let (inputs, out_index) = buffers(c);
    let bufs: Vec<offload::DeviceBuffer> = inputs
        .iter()
        .map(|b| {
            let d = device.alloc_buffer(b.len() as u64).unwrap();
            d.write(b).unwrap();
            d
        })
        .collect();
    let ptr = |i: usize| KernelArg::Ptr(bufs[i].ptr());
    let n = c.size as i32;
    let args: Vec<KernelArg> = match c.kernel {
        "saxpy" => vec![KernelArg::I32(n), KernelArg::F32(2.5), ptr(0), ptr(1)],
        "stencil7" => vec![
            KernelArg::I32(n),
            KernelArg::I32(n),
            KernelArg::I32(n),
            ptr(0),
            ptr(1),
        ],
        "hist" => vec![KernelArg::I32(n), KernelArg::I32(256), ptr(0), ptr(1)],
        "matmul" => vec![KernelArg::I32(n), ptr(0), ptr(1), ptr(2)],
        "reduce" => vec![ptr(0), ptr(1), KernelArg::I32(n)],
        _ => vec![],
    };
    let dims = LaunchDims {
        grid: c.grid,
        block: c.block,
        shared_mem_bytes: 0,
    };
    let mut times = Vec::new();
    let mut result = Vec::new();
    for r in 0..c.reps + 2 {
        let t = Instant::now();
        // SAFETY: the buffers are as long as the kernel touches for these arguments.
        unsafe { kernel.launch(dims).args_raw(&args).unchecked().run() }.unwrap();
        let dt = t.elapsed().as_secs_f64() * 1e3;
        if r == 0 && out_index != usize::MAX {
            result = vec![0; inputs[out_index].len()];
            bufs[out_index].read(&mut result).unwrap();
        }
        if r >= 2 {
            times.push(dt);
        }
    }
    let min = times.iter().copied().fold(f64::INFINITY, f64::min);
    (
        Timing {
            median: median(times),
            min,
        },
        result,
    )
}

/// Compiles a runner; `None` (with the reason printed) if it cannot be built here.
fn runner(name: &str, extra: &[&str]) -> Option<PathBuf> {
    let dir = repo_root().join("tests/benches/peers");
    let out = scratch("peers").join(name);
    let mut args = vec!["-O3", "-I", dir.to_str().unwrap()];
    args.extend_from_slice(extra);
    let src = dir.join(format!("{name}.c"));
    let o = Command::new("clang-19")
        .args(&args)
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .args(if name == "pocl_runner" {
            vec!["-lOpenCL"]
        } else {
            vec![]
        })
        .output()
        .ok()?;
    if !o.status.success() {
        println!(
            "({name} not built: {}; run scripts/bench-host-peers.sh)",
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .next()
                .unwrap_or("")
        );
        return None;
    }
    Some(out)
}

/// Runs `c` on a peer: its timing, its result and the threads (or compute units) it used.
fn peer(runner: &Path, c: &Case) -> Option<(Timing, Vec<u8>, u32)> {
    let out = scratch("peers").join(format!(
        "{}-{}.out",
        runner.file_name()?.to_str()?,
        c.label.replace([' ', ',', '^'], "_")
    ));
    let name = if c.kernel == "reduce" {
        "block_sum"
    } else {
        c.kernel
    };
    let o = Command::new(runner)
        .args([
            name,
            &c.size.to_string(),
            &c.reps.to_string(),
            out.to_str()?,
        ])
        .output()
        .ok()?;
    if !o.status.success() {
        println!(
            "({} failed on {}: {})",
            runner.display(),
            c.label,
            String::from_utf8_lossy(&o.stderr).trim()
        );
        return None;
    }
    let text = String::from_utf8_lossy(&o.stdout);
    let mut words = text.split_whitespace();
    let median: f64 = words.next()?.parse().ok()?;
    let min: f64 = words.next()?.parse().ok()?;
    let threads: u32 = words.next()?.parse().ok()?;
    Some((
        Timing { median, min },
        std::fs::read(&out).unwrap_or_default(),
        threads,
    ))
}

/// The thread counts to measure (`OFFLOAD_BENCH_THREADS=1,2`; default 1 and every core).
fn thread_counts() -> Vec<u32> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    let mut counts: Vec<u32> = match std::env::var("OFFLOAD_BENCH_THREADS") {
        Ok(v) => {
            v.split(',')
                .map(|t| {
                    t.trim().parse().ok().filter(|&n| n > 0).unwrap_or_else(|| {
                        panic!("OFFLOAD_BENCH_THREADS: '{t}' is not a thread count")
                    })
                })
                .collect()
        }
        Err(_) => vec![1, cores],
    };
    counts.dedup();
    counts
}

/// Each thread count runs in a process of its own (the host plugin sizes its pool once per
/// process), with every runtime told the same count.
fn main() {
    if std::env::var_os("OFFLOAD_BENCH_CHILD").is_some() {
        return table();
    }
    let mut failed = false;
    for threads in thread_counts() {
        let t = threads.to_string();
        let status = Command::new(std::env::current_exe().unwrap())
            .args(std::env::args().skip(1))
            .envs([
                ("OFFLOAD_BENCH_CHILD", "1"),
                ("OFFLOAD_HOST_THREADS", t.as_str()),
                ("OMP_NUM_THREADS", t.as_str()),
                ("POCL_CPU_MAX_CU_COUNT", t.as_str()),
                ("POCL_MAX_PTHREAD_COUNT", t.as_str()),
            ])
            .status()
            .unwrap();
        failed |= !status.success();
    }
    if failed {
        std::process::exit(1);
    }
}

/// `median [lowest-highest]` of per-round ratios.
fn ratio_text(ratios: &[f64]) -> String {
    if ratios.is_empty() {
        return "-".into();
    }
    let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = ratios.iter().copied().fold(0.0, f64::max);
    format!("{:.2}x [{lo:.2}-{hi:.2}]", median(ratios.to_vec()))
}

fn table() {
    let rt = host_runtime();
    let threads = rt.device("host", 0).unwrap().info().unwrap().name;
    let pocl = runner("pocl_runner", &[]);
    let omp = runner(
        "omp_runner",
        &["-march=native", "-fopenmp", "-ffp-contract=off"],
    );
    let rounds: usize = std::env::var("OFFLOAD_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(5);
    println!(
        "\nhost peers: offload host plugin ({threads}) vs PoCL vs native OpenMP; {rounds} rounds of the four in turn, each runtime's time the median over rounds of the median of its repeated launches"
    );
    println!(
        "  ratios: median over rounds of the round's ratio [lowest-highest]; spread: median over rounds of a runtime's median/min launch inside its process (.so bc PoCL OpenMP)"
    );
    println!(
        "{:<38} {:>10} {:>10} {:>10} {:>10} {:>19} {:>19}  {:<23} results",
        "kernel", "offload.so", "offload.bc", "PoCL", "OpenMP", "bc/PoCL", "bc/OMP", "spread",
    );
    let mut all_equal = true;
    let mut peer_threads = (None, None);
    // `cargo bench ... -- WORD...`: only the kernels whose label contains one of the words.
    let words: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    for c in cases()
        .into_iter()
        .filter(|c| words.is_empty() || words.iter().any(|w| c.label.contains(w.as_str())))
    {
        // Rounds of the four in turn, so that a slow spell of the machine hits all of them.
        // Per runtime (.so, bc, PoCL, OpenMP): its timing in each round, and its first result.
        let mut timings: [Vec<Option<Timing>>; 4] = Default::default();
        let mut results: [Option<Vec<u8>>; 4] = Default::default();
        for _ in 0..rounds {
            let mut runs: [Option<(Timing, Vec<u8>)>; 4] = [
                Some(offload_run(&rt, &host_kernel(c.kernel), &c)),
                Some(offload_run(&rt, &host_bitcode(c.kernel), &c)),
                None,
                None,
            ];
            for (i, (r, slot)) in [(&pocl, &mut peer_threads.0), (&omp, &mut peer_threads.1)]
                .into_iter()
                .enumerate()
            {
                if let Some((t, result, n)) = r.as_deref().and_then(|r| peer(r, &c)) {
                    runs[2 + i] = Some((t, result));
                    *slot = Some(n);
                }
            }
            for (i, run) in runs.into_iter().enumerate() {
                timings[i].push(run.as_ref().map(|r| r.0));
                if let Some((_, result)) = run {
                    results[i].get_or_insert(result);
                }
            }
        }
        // A runtime that failed in any round is left out.
        let complete = |i: usize| -> Option<Vec<Timing>> { timings[i].iter().copied().collect() };
        let series: Vec<Option<Vec<Timing>>> = (0..4).map(complete).collect();
        let time = |i: usize| {
            series[i]
                .as_ref()
                .map(|t| median(t.iter().map(|t| t.median).collect()))
        };
        let ratios = |i: usize| -> Vec<f64> {
            match (&series[1], &series[i]) {
                (Some(bc), Some(other)) => bc
                    .iter()
                    .zip(other)
                    .map(|(a, b)| a.median / b.median)
                    .collect(),
                _ => vec![],
            }
        };
        let spread = (0..4)
            .map(|i| {
                series[i].as_ref().map_or("-".to_string(), |t| {
                    format!(
                        "{:.2}",
                        median(t.iter().map(|t| t.median / t.min).collect())
                    )
                })
            })
            .collect::<Vec<_>>()
            .join(" ");
        let reference = results[0].clone().unwrap_or_default();
        let mut same = results[1].as_ref() == Some(&reference);
        for other in results[2..].iter().flatten() {
            if !c.micro && !other.is_empty() {
                same &= *other == reference;
            }
        }
        all_equal &= same;
        let unit = |ms: Option<f64>| match ms {
            None => "-".to_string(),
            Some(ms) if c.micro => format!("{:.2}us", ms * 1e3),
            Some(ms) => format!("{ms:.3}ms"),
        };
        println!(
            "{:<38} {:>10} {:>10} {:>10} {:>10} {:>19} {:>19}  {:<23} {}",
            c.label,
            unit(time(0)),
            unit(time(1)),
            unit(time(2)),
            unit(time(3)),
            ratio_text(&ratios(2)),
            ratio_text(&ratios(3)),
            spread,
            if same { "equal" } else { "DIFFER" }
        );
        if c.label.starts_with("empty kernel, 10M")
            && let (Some(so), Some(o)) = (time(0), time(3))
        {
            let items = f64::from(c.grid[0]) * f64::from(c.block[0]);
            println!(
                "  per-work-item overhead of the .so path: {:.2} ns (offload {:.2} ns, a direct call loop {:.2} ns per item, all threads)",
                (so - o) * 1e6 / items,
                so * 1e6 / items,
                o * 1e6 / items
            );
        }
    }
    println!(
        "  (PoCL used {} compute units, OpenMP {} threads)",
        peer_threads.0.map_or("-".into(), |n| n.to_string()),
        peer_threads.1.map_or("-".into(), |n| n.to_string())
    );
    if !all_equal {
        println!("RESULTS DIFFER between implementations (see above)");
        std::process::exit(1);
    }
}
