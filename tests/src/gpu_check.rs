//! The GPU checks' common part: the host tests' kernels (saxpy, 2-D stencil, the 16-argument
//! kernel, atomics, 3-D ids) launched on a device from each image kind a backend loads, every
//! buffer compared bit for bit with the host plugin's results. The backend parts
//! (`tests/src/cuda_check.rs`, `tests/src/amdgpu_check.rs`) prepare the images and name the
//! kinds; they are included as modules by their check binaries and GPU tests, since each links
//! its backend as a library and one program can hold only one backend library.

use offload::{KernelArg, LaunchDims};
use std::time::Instant;

/// The kernels, as `(source file, kernel symbol)`.
pub const KERNELS: [(&str, &str); 5] = [
    ("saxpy", "saxpy"),
    ("stencil2d", "stencil2d"),
    ("args16", "args16"),
    ("atomics", "histogram"),
    ("ids", "ids"),
];

/// One buffer argument's initial contents.
#[derive(Debug, Clone)]
enum Init {
    Zero,
    IotaF32,
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
    dims: LaunchDims,
    args: Vec<Arg>,
}

/// The launches: the host tests' kernels, at sizes that keep a GPU busy for a moment.
pub fn cases() -> Vec<Case> {
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
            dims: dims([3, 2, 2], [4, 3, 2]),
            args: vec![Buffer {
                bytes: 4 * 12 * 12 * 24,
                init: Init::Zero,
            }],
        },
    ]
}

fn initial(bytes: usize, init: &Init) -> Vec<u8> {
    match init {
        Init::Zero => vec![0; bytes],
        Init::IotaF32 => (0..bytes / 4)
            .flat_map(|i| (i as f32).to_le_bytes())
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
    let program = device.load(image).map_err(|e| e.to_string())?;
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
    unsafe { program.launch(&kernel, &case.dims, &args) }.map_err(|e| e.to_string())?;
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

/// Runs `case` on `device` from each of `kinds` (`(label, image)`) and compares every buffer
/// with `want` (the host's), printing one line per kind; the failures, if any.
pub fn compare_kinds(
    device: &offload::Device,
    jit: Option<&offload::PluginSlot>,
    case: &Case,
    want: &[Vec<u8>],
    kinds: Vec<(String, Vec<u8>)>,
) -> Vec<String> {
    let k = case.kernel;
    let mut failures = Vec::new();
    for (kind, image) in kinds {
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
            Ok(got) if got == want => {
                println!("{k:10} {kind:20} matches the host bit for bit ({ms:.1} ms{jit_ms})")
            }
            Ok(got) => {
                let which: Vec<usize> = (0..got.len()).filter(|&i| got[i] != want[i]).collect();
                println!("{k:10} {kind:20} DIFFERS from the host in buffer(s) {which:?}");
                failures.push(format!("{k} from {kind}: buffers {which:?} differ"));
            }
            Err(e) => {
                println!("{k:10} {kind:20} FAILED: {e}");
                failures.push(format!("{k} from {kind}: {e}"));
            }
        }
    }
    failures
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
