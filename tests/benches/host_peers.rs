//! The host backend against its peers, in one run: each kernel on offload's host plugin from a
//! shared object (direct calls per work item) and from bitcode (the JIT's work-group
//! functions), on PoCL (OpenCL C versions of the same kernels, same inputs, same decomposition:
//! `tests/benches/peers/pocl_runner.c`), and as native OpenMP loops (`clang-19 -O3
//! -march=native -fopenmp`: `tests/benches/peers/omp_runner.c`). Prints per-kernel medians and
//! the ratios offload/PoCL and offload/native, and checks that every result is equal, bit for
//! bit, across all of them.
//!
//!     scripts/bench-host-peers.sh        (installs PoCL and libomp if missing, then runs this)
//!     cargo bench -p offload-tests --bench host_peers
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

/// Runs `c` on the host plugin from `image`: (median ms, the result buffer after the first
/// launch).
fn offload_run(rt: &offload::Runtime, image: &Path, c: &Case) -> (f64, Vec<u8>) {
    let device = rt.device("host", 0).unwrap();
    let program = device.load(&std::fs::read(image).unwrap()).unwrap();
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
        unsafe { program.launch(&kernel, &dims, &args) }.unwrap();
        let dt = t.elapsed().as_secs_f64() * 1e3;
        if r == 0 && out_index != usize::MAX {
            result = vec![0; inputs[out_index].len()];
            bufs[out_index].read(&mut result).unwrap();
        }
        if r >= 2 {
            times.push(dt);
        }
    }
    (median(times), result)
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

fn peer(runner: &Path, c: &Case) -> Option<(f64, Vec<u8>)> {
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
    let ms: f64 = String::from_utf8_lossy(&o.stdout).trim().parse().ok()?;
    Some((ms, std::fs::read(&out).unwrap_or_default()))
}

fn main() {
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
        .unwrap_or(3);
    println!(
        "host peers: offload host plugin ({threads}) vs PoCL vs native OpenMP; median of {rounds} rounds of the four in turn, each the median of repeated launches"
    );
    println!(
        "{:<38} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9} {:>9}  results",
        "kernel", "offload.so", "offload.bc", "PoCL", "OpenMP", "bc/PoCL", "bc/OMP", "so/PoCL",
    );
    let mut all_equal = true;
    // `cargo bench ... -- WORD...`: only the kernels whose label contains one of the words.
    let words: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    for c in cases()
        .into_iter()
        .filter(|c| words.is_empty() || words.iter().any(|w| c.label.contains(w.as_str())))
    {
        // Rounds of the four in turn, so that a slow spell of the machine hits all of them;
        // each time is the median of its rounds (each the median of repeated launches).
        let mut so = (Vec::new(), Vec::new());
        let mut bc = (Vec::new(), Vec::new());
        let mut p: Option<(Vec<f64>, Vec<u8>)> = Some((Vec::new(), Vec::new()));
        let mut o: Option<(Vec<f64>, Vec<u8>)> = Some((Vec::new(), Vec::new()));
        for round in 0..rounds {
            let runs = [
                Some(offload_run(&rt, &host_kernel(c.kernel), &c)),
                Some(offload_run(&rt, &host_bitcode(c.kernel), &c)),
                pocl.as_deref().and_then(|r| peer(r, &c)),
                omp.as_deref().and_then(|r| peer(r, &c)),
            ];
            let [rs, rb, rp, ro] = runs;
            for (slot, run) in [(&mut so, rs), (&mut bc, rb)] {
                let (ms, result) = run.expect("offload runs");
                slot.0.push(ms);
                if round == 0 {
                    slot.1 = result;
                }
            }
            for (slot, run) in [(&mut p, rp), (&mut o, ro)] {
                match (slot.as_mut(), run) {
                    (Some(s), Some((ms, result))) => {
                        s.0.push(ms);
                        if round == 0 {
                            s.1 = result;
                        }
                    }
                    _ => *slot = None,
                }
            }
        }
        let so = (median(so.0), so.1);
        let bc = (median(bc.0), bc.1);
        let p = p.map(|(t, r)| (median(t), r));
        let o = o.map(|(t, r)| (median(t), r));
        let mut same = so.1 == bc.1;
        for other in [&p, &o].into_iter().flatten() {
            if !c.micro && !other.1.is_empty() {
                same &= other.1 == so.1;
            }
        }
        all_equal &= same;
        let unit = |ms: f64| {
            if c.micro {
                format!("{:.2}us", ms * 1e3)
            } else {
                format!("{ms:.3}ms")
            }
        };
        let ratio =
            |a: f64, b: Option<f64>| b.map_or("-".to_string(), |b| format!("{:.2}x", a / b));
        println!(
            "{:<38} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9} {:>9}  {}",
            c.label,
            unit(so.0),
            unit(bc.0),
            p.as_ref().map_or("-".into(), |p| unit(p.0)),
            o.as_ref().map_or("-".into(), |o| unit(o.0)),
            ratio(bc.0, p.as_ref().map(|p| p.0)),
            ratio(bc.0, o.as_ref().map(|o| o.0)),
            ratio(so.0, p.as_ref().map(|p| p.0)),
            if same { "equal" } else { "DIFFER" }
        );
        if c.label.starts_with("empty kernel, 10M") {
            if let Some(o) = &o {
                let items = f64::from(c.grid[0]) * f64::from(c.block[0]);
                println!(
                    "  per-work-item overhead of the .so path: {:.2} ns (offload {:.2} ns, a direct call loop {:.2} ns per item, all threads)",
                    (so.0 - o.0) * 1e6 / items,
                    so.0 * 1e6 / items,
                    o.0 * 1e6 / items
                );
            }
        }
    }
    if !all_equal {
        println!("RESULTS DIFFER between implementations (see above)");
        std::process::exit(1);
    }
}
