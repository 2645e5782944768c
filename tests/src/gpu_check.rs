//! The GPU checks' common part: the host tests' kernels (saxpy, 2-D stencil, the 16-argument
//! kernel, atomics, 3-D ids, and the barrier and shared-memory kernels: a block reduction, a
//! block scan in dynamic shared memory, a tiled matrix product, a 64 KiB dynamic-shared
//! reversal) launched on a device from each image kind a backend loads, every buffer compared
//! bit for bit with the host plugin's results; and the checks of what the fake drivers cannot
//! prove ([`run_extras`]): overlapping device copies, queued work from several threads,
//! events and their timing, globals, host and shared memory, a kernel that faults. The backend parts
//! (`tests/src/cuda_check.rs`, `tests/src/amdgpu_check.rs`) prepare the images and name the
//! kinds; they are included as modules by their check binaries and GPU tests, since each links
//! its backend as a library and one program can hold only one backend library.

use offload::{KernelArg, LaunchDims};
use std::time::Instant;

/// The kernels compared with the host, as `(source file, kernel symbol)`.
pub const KERNELS: [(&str, &str); 9] = [
    ("saxpy", "saxpy"),
    ("stencil2d", "stencil2d"),
    ("args16", "args16"),
    ("atomics", "histogram"),
    ("ids", "ids"),
    ("reduce", "block_sum"),
    ("scan", "block_scan"),
    ("matmul_tiled", "matmul_tiled"),
    ("shared_reverse", "shared_reverse"),
];

/// The other kernels a check needs images of: the queue and memory checks' `add_k`, the
/// kernel that faults, and (CUDA) the launch benchmark's `empty`.
pub const EXTRA_KERNELS: [&str; 3] = ["add_k", "fault", "empty"];

/// One buffer argument's initial contents.
#[derive(Debug, Clone)]
enum Init {
    Zero,
    IotaF32,
    IotaU32,
    FillF32(f32),
}

#[derive(Debug, Clone)]
enum Arg {
    Scalar(KernelArg),
    Buffer { bytes: usize, init: Init },
}

/// One kernel launch of the check: the kernel, its shape and its arguments.
#[derive(Debug)]
pub struct Case {
    /// The source file in `kernels/`.
    pub kernel: &'static str,
    /// The kernel's symbol.
    pub symbol: &'static str,
    /// What this case of the kernel checks, when a kernel has several.
    pub note: &'static str,
    dims: LaunchDims,
    args: Vec<Arg>,
}

/// The launches: the host tests' kernels, at sizes that keep a GPU busy for a moment; those
/// that ask for more dynamic shared memory than `max_shared` (the backend's most) are left
/// out, and said so.
pub fn cases(max_shared: u32) -> Vec<Case> {
    let all = all_cases();
    let (run, skip): (Vec<Case>, Vec<Case>) = all
        .into_iter()
        .partition(|c| c.dims.shared_mem_bytes <= max_shared);
    for c in skip {
        println!(
            "{:10} skipped: {} ({} bytes of dynamic shared memory; this device has at most {max_shared})",
            c.kernel, c.note, c.dims.shared_mem_bytes
        );
    }
    run
}

fn all_cases() -> Vec<Case> {
    use Arg::{Buffer, Scalar};
    let n = 1_000_003usize;
    let dims = |grid: [u32; 3], block: [u32; 3]| LaunchDims {
        grid,
        block,
        shared_mem_bytes: 0,
    };
    vec![
        Case {
            kernel: "saxpy",
            symbol: "saxpy",
            note: "",
            dims: dims([n.div_ceil(256) as u32, 1, 1], [256, 1, 1]),
            args: vec![
                Scalar(KernelArg::I32(n as i32)),
                Scalar(KernelArg::F32(2.5)),
                Buffer {
                    bytes: 4 * n,
                    init: Init::IotaF32,
                },
                Buffer {
                    bytes: 4 * n,
                    init: Init::FillF32(1.0),
                },
            ],
        },
        Case {
            kernel: "stencil2d",
            symbol: "stencil2d",
            note: "",
            dims: dims([63, 63, 1], [16, 16, 1]),
            args: vec![
                Scalar(KernelArg::I32(1000)),
                Scalar(KernelArg::I32(1000)),
                Buffer {
                    bytes: 4 * 1_000_000,
                    init: Init::IotaF32,
                },
                Buffer {
                    bytes: 4 * 1_000_000,
                    init: Init::Zero,
                },
            ],
        },
        Case {
            kernel: "args16",
            symbol: "args16",
            note: "",
            dims: dims([8, 1, 1], [128, 1, 1]),
            args: vec![
                Scalar(KernelArg::I32(-1)),
                Scalar(KernelArg::I64(-2)),
                Scalar(KernelArg::F32(3.5)),
                Scalar(KernelArg::F64(-4.25)),
                Scalar(KernelArg::I32(5)),
                Scalar(KernelArg::F32(6.0)),
                Scalar(KernelArg::F64(7.0)),
                Scalar(KernelArg::I64(8_000_000_000)),
                Scalar(KernelArg::F32(9.0)),
                Scalar(KernelArg::F64(10.0)),
                Scalar(KernelArg::I32(11)),
                Scalar(KernelArg::F64(12.0)),
                Scalar(KernelArg::F32(13.0)),
                Scalar(KernelArg::I64(14)),
                Buffer {
                    bytes: 8 * 1000,
                    init: Init::Zero,
                },
                Scalar(KernelArg::I32(1000)),
            ],
        },
        Case {
            kernel: "atomics",
            symbol: "histogram",
            note: "",
            dims: dims([4000, 1, 1], [256, 1, 1]),
            args: vec![
                Scalar(KernelArg::I32(1_000_000)),
                Scalar(KernelArg::I32(256)),
                Buffer {
                    bytes: 4 * 256,
                    init: Init::Zero,
                },
                Buffer {
                    bytes: 8,
                    init: Init::Zero,
                },
            ],
        },
        Case {
            kernel: "ids",
            symbol: "ids",
            note: "",
            dims: dims([3, 2, 2], [4, 3, 2]),
            args: vec![Buffer {
                bytes: 4 * 12 * 12 * 24,
                init: Init::Zero,
            }],
        },
        Case {
            kernel: "reduce",
            symbol: "block_sum",
            note: "static shared memory and barriers",
            dims: dims([2048, 1, 1], [256, 1, 1]),
            args: vec![
                Buffer {
                    bytes: 4 * 2048 * 512,
                    init: Init::IotaU32,
                },
                Buffer {
                    bytes: 4 * 2048,
                    init: Init::Zero,
                },
                Scalar(KernelArg::I32(2048 * 512)),
            ],
        },
        Case {
            kernel: "scan",
            symbol: "block_scan",
            note: "8 KiB of dynamic shared memory",
            dims: with_shared([1024, 1, 1], [1024, 1, 1], 2 * 1024 * 4),
            args: scan_args(1024 * 1024),
        },
        Case {
            kernel: "scan",
            symbol: "block_scan",
            note: "96 KiB of dynamic shared memory asked for (opt-in)",
            dims: with_shared([256, 1, 1], [1024, 1, 1], 96 << 10),
            args: scan_args(256 * 1024),
        },
        Case {
            kernel: "matmul_tiled",
            symbol: "matmul_tiled",
            note: "static tiles",
            dims: dims([16, 16, 1], [16, 16, 1]),
            args: matmul_args(256),
        },
        Case {
            kernel: "matmul_tiled",
            symbol: "matmul_tiled",
            note: "2 KiB of static tiles + 47 KiB dynamic: over 48 KiB together",
            dims: with_shared([16, 16, 1], [16, 16, 1], 47 << 10),
            args: matmul_args(256),
        },
        Case {
            kernel: "shared_reverse",
            symbol: "shared_reverse",
            note: "64 KiB of dynamic shared memory used",
            dims: with_shared([64, 1, 1], [512, 1, 1], 64 << 10),
            args: vec![
                Buffer {
                    bytes: 4 * 64 * 16384,
                    init: Init::IotaU32,
                },
                Buffer {
                    bytes: 4 * 64 * 16384,
                    init: Init::Zero,
                },
                Scalar(KernelArg::I32(16384)),
            ],
        },
    ]
}

impl Case {
    /// The sizes of the kernel's parameters as the case passes them (a buffer is a pointer).
    pub fn arg_sizes(&self) -> Vec<usize> {
        self.args
            .iter()
            .map(|a| match a {
                Arg::Scalar(v) => v.size(),
                Arg::Buffer { .. } => std::mem::size_of::<u64>(),
            })
            .collect()
    }

    /// The same launch with its last argument left out: one the driver must refuse.
    pub fn one_argument_short(&self) -> Case {
        Case {
            args: self.args[..self.args.len().saturating_sub(1)].to_vec(),
            dims: self.dims,
            ..*self
        }
    }
}

/// `heavy(n, in, out)` (`kernels/heavy.c`, about 130 registers a thread on sm_90) on 2^20
/// words with `block` threads per block.
pub fn heavy_case(block: u32) -> Case {
    let n = 1usize << 20;
    Case {
        kernel: "heavy",
        symbol: "heavy",
        note: "",
        dims: LaunchDims {
            grid: [(n as u32).div_ceil(block.max(1)), 1, 1],
            block: [block, 1, 1],
            shared_mem_bytes: 0,
        },
        args: vec![
            Arg::Scalar(KernelArg::I32(n as i32)),
            Arg::Buffer {
                bytes: 4 * n,
                init: Init::IotaU32,
            },
            Arg::Buffer {
                bytes: 4 * n,
                init: Init::Zero,
            },
        ],
    }
}

fn with_shared(grid: [u32; 3], block: [u32; 3], shared_mem_bytes: u32) -> LaunchDims {
    LaunchDims {
        grid,
        block,
        shared_mem_bytes,
    }
}

/// `block_scan(in, out, n)` on `n` words.
fn scan_args(n: usize) -> Vec<Arg> {
    vec![
        Arg::Buffer {
            bytes: 4 * n,
            init: Init::IotaU32,
        },
        Arg::Buffer {
            bytes: 4 * n,
            init: Init::Zero,
        },
        Arg::Scalar(KernelArg::I32(n as i32)),
    ]
}

fn matmul_args(n: usize) -> Vec<Arg> {
    vec![
        Arg::Scalar(KernelArg::I32(n as i32)),
        Arg::Buffer {
            bytes: 4 * n * n,
            init: Init::FillF32(0.5),
        },
        Arg::Buffer {
            bytes: 4 * n * n,
            init: Init::FillF32(0.25),
        },
        Arg::Buffer {
            bytes: 4 * n * n,
            init: Init::Zero,
        },
    ]
}

fn initial(bytes: usize, init: &Init) -> Vec<u8> {
    match init {
        Init::Zero => vec![0; bytes],
        Init::IotaF32 => (0..bytes / 4)
            .flat_map(|i| (i as f32).to_le_bytes())
            .collect(),
        Init::IotaU32 => (0..bytes / 4)
            .flat_map(|i| (i as u32 % 1000).to_le_bytes())
            .collect(),
        Init::FillF32(v) => (0..bytes / 4).flat_map(|_| v.to_le_bytes()).collect(),
    }
}

/// Loads `image` on `device`, runs the case, and returns every buffer's final contents.
pub fn run_case(
    device: &offload::Device,
    image: &[u8],
    case: &Case,
) -> Result<Vec<Vec<u8>>, String> {
    let program = crate::load(device, image).map_err(|e| e.to_string())?;
    let kernel = program.kernel(case.symbol).map_err(|e| e.to_string())?;
    let mut buffers = Vec::new();
    let mut args = Vec::new();
    for a in &case.args {
        match a {
            Arg::Scalar(v) => args.push(*v),
            Arg::Buffer { bytes, init } => {
                let b = device
                    .alloc_buffer(*bytes as u64)
                    .map_err(|e| e.to_string())?;
                b.write(&initial(*bytes, init)).map_err(|e| e.to_string())?;
                args.push(KernelArg::Ptr(b.ptr()));
                buffers.push(b);
            }
        }
    }
    // SAFETY: the buffers are as long as the kernel touches for these arguments.
    unsafe { kernel.launch(case.dims).args_raw(&args).unchecked().run() }
        .map_err(|e| e.to_string())?;
    buffers
        .iter()
        .map(|b| {
            let mut out = vec![0; b.size() as usize];
            b.read(&mut out).map(|()| out).map_err(|e| e.to_string())
        })
        .collect()
}

/// Best per-iteration time of `f` over 5 rounds of `n` calls, in µs.
pub fn per_call_us(n: u32, mut f: impl FnMut()) -> f64 {
    for _ in 0..n / 10 {
        f();
    }
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..n {
            f();
        }
        best = best.min(t.elapsed().as_secs_f64() * 1e6 / f64::from(n));
    }
    best
}

/// What a check run found, check by check, for the printed lines and the JSON summary.
#[derive(Debug, Default)]
pub struct Report {
    entries: Vec<serde_json::Value>,
    failures: Vec<String>,
}

impl Report {
    /// Records one check: `Ok(detail)` passed, `Err(why)` failed; printed as it is recorded.
    pub fn record(&mut self, check: &str, ms: f64, outcome: Result<String, String>) {
        let (status, detail) = match outcome {
            Ok(d) => ("pass", d),
            Err(e) => {
                self.failures.push(format!("{check}: {e}"));
                ("FAIL", e)
            }
        };
        println!("{status:4} {check:56} {detail} ({ms:.1} ms)");
        self.entries.push(serde_json::json!({
            "check": check, "status": status.to_lowercase(), "detail": detail, "ms": ms,
        }));
    }

    /// Records a check that ran but whose results are not compared (a dry run against a fake
    /// driver, which does not compute the kernel).
    pub fn not_compared(&mut self, check: &str, ms: f64, why: &str) {
        println!("ran  {check:56} not compared: {why} ({ms:.1} ms)");
        self.entries.push(serde_json::json!({
            "check": check, "status": "not-compared", "detail": why, "ms": ms,
        }));
    }

    /// Records a check that could not run on this machine (a tool it needs is missing), with
    /// the reason: neither a pass nor a failure, and said so in the summary.
    pub fn skipped(&mut self, check: &str, why: &str) {
        println!("skip {check:56} {why}");
        self.entries.push(serde_json::json!({
            "check": check, "status": "skipped", "detail": why, "ms": 0.0,
        }));
    }

    /// Runs `f` as check `check`, timing it; a panic inside is that check's failure.
    pub fn run(&mut self, check: &str, f: impl FnOnce() -> Result<String, String>) {
        let t = Instant::now();
        let outcome =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
                Err(p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "panicked".into()))
            });
        self.record(check, t.elapsed().as_secs_f64() * 1e3, outcome);
    }

    /// Every failure, one per line; `Ok` when there is none.
    pub fn result(&self) -> Result<(), String> {
        if self.failures.is_empty() {
            Ok(())
        } else {
            Err(self.failures.join("\n"))
        }
    }

    /// Writes the summary: `{backend, device, dry_run, passed, failed, not_compared, skipped,
    /// checks: [...]}`.
    pub fn write_json(
        &self,
        path: &std::path::Path,
        backend: &str,
        device: &str,
    ) -> Result<(), String> {
        let count = |s: &str| self.entries.iter().filter(|e| e["status"] == s).count();
        let json = serde_json::json!({
            "backend": backend,
            "device": device,
            "dry_run": dry_run(),
            "passed": count("pass"),
            "failed": count("fail"),
            "not_compared": count("not-compared"),
            "skipped": count("skipped"),
            "checks": self.entries,
        });
        std::fs::write(
            path,
            serde_json::to_string_pretty(&json).unwrap_or_default(),
        )
        .map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// Whether this is a dry run against a fake driver (`OFFLOAD_GPU_CHECK_DRY_RUN=1`, set by
/// `scripts/gpu-check.sh BACKEND dry-run`): every step runs, but the results of kernels the
/// fake does not compute are not compared.
pub fn dry_run() -> bool {
    std::env::var_os("OFFLOAD_GPU_CHECK_DRY_RUN").is_some_and(|v| v == "1")
}

/// Runs `case` on `device` from each of `kinds` (`(label, image)`) and compares every buffer
/// with `want` (the host's), one check per kind.
pub fn compare_kinds(
    report: &mut Report,
    device: &offload::Device,
    jit: Option<&offload::PluginSlot>,
    case: &Case,
    want: &[Vec<u8>],
    kinds: Vec<(String, Vec<u8>)>,
) {
    let name = if case.note.is_empty() {
        case.kernel.to_string()
    } else {
        format!("{} ({})", case.kernel, case.note)
    };
    for (kind, image) in kinds {
        let check = format!("{name} from {kind}");
        let before = jit.and_then(|j| j.jit_stats());
        let t = Instant::now();
        let got = run_case(device, &image, case);
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let jit_ms = match (before, jit.and_then(|j| j.jit_stats())) {
            (Some(b), Some(a)) if a.compiles > b.compiles => {
                format!(", JIT {:.1} ms", (a.compile_ns - b.compile_ns) as f64 / 1e6)
            }
            _ => String::new(),
        };
        match got {
            Ok(got) if got == want => report.record(
                &check,
                ms,
                Ok(format!("matches the host bit for bit{jit_ms}")),
            ),
            Ok(_) if dry_run() => {
                report.not_compared(&check, ms, "the fake driver does not compute it")
            }
            Ok(got) => {
                let which: Vec<usize> = (0..got.len()).filter(|&i| got[i] != want[i]).collect();
                report.record(
                    &check,
                    ms,
                    Err(format!("buffer(s) {which:?} differ from the host's")),
                );
            }
            Err(e) => report.record(&check, ms, Err(e)),
        }
    }
}

/// The images and tools [`run_extras`] needs: `add_k` and `fault` for the device, and the
/// `offload` command to run the faulting kernel in a process of its own.
#[derive(Debug)]
pub struct Extras<'a> {
    /// `kernels/add_k.c` for the device (with its `OFFLOAD_PARAMS` record).
    pub add_k: Vec<u8>,
    /// `kernels/fault.c` for the device, as a file.
    pub fault: std::path::PathBuf,
    /// The `offload` executable.
    pub offload: std::path::PathBuf,
    /// What the fault's process must print (`CUDA_ERROR_ILLEGAL_ADDRESS`, `memory access
    /// fault`).
    pub fault_says: &'a str,
}

/// The checks beyond the kernels, each a line of the report: overlapping device-to-device
/// copies, the seeded mix of queued and synchronous work from three threads on two queues
/// each, events and their timing, a global, host and shared memory as kernel arguments, and
/// a kernel that faults (in a process of its own: the device is unusable after it).
pub fn run_extras(report: &mut Report, device: &offload::Device, x: &Extras<'_>) {
    report.run("device copies, overlapping both ways (400 seeded)", || {
        crate::check_overlapping_device_copies(device, 0x9c0e, 400);
        Ok("memmove's result every time".into())
    });
    let program = match crate::load(device, &x.add_k) {
        Ok(p) => p,
        Err(e) => {
            report.record("add_k loads", 0.0, Err(e.to_string()));
            return;
        }
    };
    let add = match program.kernel("add_k") {
        Ok(k) => k,
        Err(e) => {
            report.record("add_k is found", 0.0, Err(e.to_string()));
            return;
        }
    };
    report.run(
        "queued and synchronous work, 3 threads x 2 queues (seeded)",
        || {
            crate::check_random_queued_work(device, &add, 0x9c0f);
            Ok("every read equals the model".into())
        },
    );
    report.run("events and their timing", || {
        let n = 1 << 22;
        let mut x = device.alloc::<u32>(n).map_err(|e| e.to_string())?;
        x.fill(1).map_err(|e| e.to_string())?;
        let q = device.queue().map_err(|e| e.to_string())?;
        let before = q.record().map_err(|e| e.to_string())?;
        for _ in 0..8 {
            add.launch(LaunchDims::for_elems(n as u64, 256).map_err(|e| e.to_string())?)
                .arg(n as i32)
                .arg(2u32)
                .arg(&mut x)
                .on(&q)
                .run()
                .map_err(|e| e.to_string())?;
        }
        let after = q.record().map_err(|e| e.to_string())?;
        after.synchronize().map_err(|e| e.to_string())?;
        if !after.is_complete().map_err(|e| e.to_string())? {
            return Err("an event waited for is not complete".into());
        }
        let took = after.elapsed_since(&before).map_err(|e| e.to_string())?;
        let got = x.to_vec().map_err(|e| e.to_string())?;
        if let Some(i) = got.iter().position(|v| *v != 17) {
            return Err(format!(
                "element {i} is {} after 8 launches of +2 on 1",
                got[i]
            ));
        }
        Ok(format!(
            "8 launches on 4M elements: {:.3} ms between the events",
            took.as_secs_f64() * 1e3
        ))
    });
    report.run("a global (the OFFLOAD_PARAMS record of add_k)", || {
        let g = program
            .global::<u8>("__offload_params_add_k")
            .map_err(|e| e.to_string())?;
        let bytes = g.to_vec().map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&bytes);
        if !text.starts_with("int n, unsigned k, unsigned x[n]") {
            return Err(format!("the global reads '{text}'"));
        }
        Ok(format!("{} bytes read back", bytes.len()))
    });
    report.run("host and shared memory as kernel arguments", || {
        let n = 4096;
        let mut out = Vec::new();
        for (kind, mut buf) in [
            (
                "host",
                device.alloc_host::<u32>(n).map_err(|e| e.to_string())?,
            ),
            (
                "shared",
                device.alloc_shared::<u32>(n).map_err(|e| e.to_string())?,
            ),
        ] {
            for (i, v) in buf
                .as_mut_slice()
                .map_err(|e| e.to_string())?
                .iter_mut()
                .enumerate()
            {
                *v = i as u32;
            }
            add.launch(LaunchDims::for_elems(n as u64, 256).map_err(|e| e.to_string())?)
                .arg(n as i32)
                .arg(5u32)
                .arg(&mut buf)
                .run()
                .map_err(|e| e.to_string())?;
            let got = buf.as_slice().map_err(|e| e.to_string())?;
            if let Some(i) = (0..n).find(|&i| got[i] != i as u32 + 5) {
                return Err(format!("{kind} memory: element {i} is {}", got[i]));
            }
            out.push(kind);
        }
        Ok(format!(
            "{} memory: the kernel's writes seen in place",
            out.join(" and ")
        ))
    });
    report.run("a kernel that faults (its own process)", || {
        let out = std::process::Command::new(&x.offload)
            .args([
                "run",
                x.fault.to_str().unwrap_or_default(),
                "--kernel",
                "fault",
                "--arg",
                "i32:0",
            ])
            .output()
            .map_err(|e| format!("{}: {e}", x.offload.display()))?;
        let err = String::from_utf8_lossy(&out.stderr);
        match out.status.code() {
            Some(1) if err.contains(x.fault_says) => Ok(format!(
                "exit 1: {}",
                err.trim().lines().last().unwrap_or_default()
            )),
            code => Err(format!(
                "exit {code:?} (want 1 and '{}'): {}",
                x.fault_says,
                err.trim()
            )),
        }
    });
}

/// The host's results for `case`, from the host shared object of its kernel in `dir`.
pub fn host_results(
    runtime: &offload::Runtime,
    dir: &std::path::Path,
    case: &Case,
) -> Result<Vec<Vec<u8>>, String> {
    let host = runtime.device("host", 0).map_err(|e| e.to_string())?;
    let so = std::fs::read(dir.join(format!("{}.host.so", case.kernel)))
        .map_err(|e| format!("{}.host.so: {e}", case.kernel))?;
    run_case(&host, &so, case).map_err(|e| format!("{} on the host: {e}", case.kernel))
}

/// The runtime of a check binary: the plugins (and the JIT worker, `offload`, ld.lld) next to
/// its executable, each plugin's state printed; and that directory.
pub fn runtime_beside_exe() -> Result<(std::path::PathBuf, offload::Runtime), String> {
    let exe_dir = offload_core::fs::exe_dir().ok_or("no executable directory")?;
    let runtime = offload::Runtime::with_plugin_dirs(std::slice::from_ref(&exe_dir), None);
    for slot in runtime.plugins() {
        println!("plugin   {:6} {}", slot.name(), slot.status().label());
        if let Some(r) = slot.status().reason() {
            println!("         {r}");
        }
    }
    Ok((exe_dir, runtime))
}

/// The end of a check binary's run: writes `report`'s summary for `backend` (with the
/// compute-unit kind of its first device) where [`summary_path`] says, prints where, and
/// returns the report's result.
pub fn finish(
    report: &Report,
    runtime: &offload::Runtime,
    backend: &str,
    dir: &std::path::Path,
) -> Result<(), String> {
    let kind = runtime
        .device(backend, 0)
        .and_then(|d| d.info())
        .map(|i| i.compute_unit_kind)
        .unwrap_or_default();
    let json = summary_path(dir);
    report.write_json(&json, backend, &kind)?;
    println!("summary  {}", json.display());
    report.result()
}

/// Where the JSON summary goes: `OFFLOAD_GPU_CHECK_JSON`, else `summary.json` next to the
/// images' directory `dir`.
pub fn summary_path(dir: &std::path::Path) -> std::path::PathBuf {
    std::env::var_os("OFFLOAD_GPU_CHECK_JSON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| dir.parent().unwrap_or(dir).join("summary.json"))
}
