//! The CUDA GPU check: the host tests' kernels (saxpy, 2-D stencil, the 16-argument kernel,
//! atomics, 3-D ids) from cubin, PTX, fatbin and bitcode images on a CUDA device, every result
//! compared bit for bit with the host plugin's; then the launch overhead against a raw `cudarc`
//! launch, and the JIT times. Images are prepared where the build tools are (clang-19, the JIT,
//! ptxas) and run where the GPU is, which needs only the NVIDIA driver and the files prepared.
//!
//! Used by `scripts/gpu-check-cuda.sh` (through the `cuda-gpu-check` binary) and by the
//! `#[ignore]`d GPU test in `tests/tests/cuda.rs`.

use crate::{host_kernel, nvptx_bitcode, nvptx_jit, ptxas_cubin};
use offload::{KernelArg, LaunchDims};
use offload_plugin_cuda::fatbin::{self, EntryKind};
use offload_plugin_cuda::sm::Sm;
use std::path::Path;
use std::time::Instant;

/// The kernels, as `(source file, kernel symbol)`.
pub const KERNELS: [(&str, &str); 5] = [
    ("saxpy", "saxpy"),
    ("stencil2d", "stencil2d"),
    ("args16", "args16"),
    ("atomics", "histogram"),
    ("ids", "ids"),
];

/// The SM the PTX and bitcode are built for: old enough that every current GPU runs it.
pub const BASE_SM: &str = "sm_80";

/// The SMs cubins are prepared for (the H200's `sm_90a`, and `sm_90`).
pub const CUBIN_SMS: [&str; 2] = ["sm_90a", "sm_90"];

/// Writes every image the check needs into `dir`: `<k>.host.so`, `<k>.bc` and `<k>.ptx` (for
/// [`BASE_SM`]), `<k>.<sm>.cubin` for each of `sms` and for [`BASE_SM`], and `empty.*` for the
/// launch benchmark. Needs clang-19, the workspace's `offload` and ptxas (the test helpers').
pub fn prepare(dir: &Path, sms: &[&str]) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let write = |name: String, bytes: &[u8]| {
        std::fs::write(dir.join(&name), bytes).map_err(|e| format!("{name}: {e}"))
    };
    let mut names: Vec<&str> = KERNELS.iter().map(|(k, _)| *k).collect();
    names.push("empty");
    for k in names {
        write(format!("{k}.host.so"), &read(&host_kernel(k))?)?;
        let bc = nvptx_bitcode(k, BASE_SM);
        write(format!("{k}.bc"), &read(&bc)?)?;
        let ptx = nvptx_jit(&bc, BASE_SM, &["--emit-ptx"], &format!("gpu-check-{k}"));
        write(format!("{k}.ptx"), &ptx)?;
        let mut all = sms.to_vec();
        all.push(BASE_SM);
        for sm in all {
            write(
                format!("{k}.{sm}.cubin"),
                &ptxas_cubin(&ptx, sm, &format!("gpu-check-{k}")),
            )?;
        }
    }
    Ok(())
}

fn read(p: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))
}

/// One buffer argument's initial contents.
#[derive(Clone)]
enum Init {
    Zero,
    IotaF32,
    FillF32(f32),
}

#[derive(Clone)]
enum Arg {
    Scalar(KernelArg),
    Buffer { bytes: usize, init: Init },
}

struct Case {
    kernel: &'static str,
    symbol: &'static str,
    dims: LaunchDims,
    args: Vec<Arg>,
}

fn cases() -> Vec<Case> {
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
fn run_case(device: &offload::Device, image: &[u8], case: &Case) -> Result<Vec<Vec<u8>>, String> {
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
    program
        .launch(kernel, &case.dims, &args)
        .map_err(|e| e.to_string())?;
    buffers
        .iter()
        .map(|b| {
            let mut out = vec![0; b.size() as usize];
            b.read(&mut out).map(|()| out).map_err(|e| e.to_string())
        })
        .collect()
}

/// Runs the check on `cuda:0` against `host:0` with the images in `dir`, printing one line per
/// kernel and image kind; `Err` lists every mismatch or failure.
pub fn run(dir: &Path, runtime: &offload::Runtime) -> Result<(), String> {
    let host = runtime.device("host", 0).map_err(|e| e.to_string())?;
    let gpu = runtime
        .device("cuda", 0)
        .map_err(|e| format!("no CUDA device: {e}"))?;
    let info = gpu.info().map_err(|e| e.to_string())?;
    let sm = Sm::parse(&info.compute_unit_kind).ok_or("the device has no SM architecture")?;
    println!(
        "device   cuda:0  {}  compute unit {}  {} multiprocessors",
        info.name, info.compute_unit_kind, info.compute_units
    );
    let jit = runtime.plugin("cuda").map_err(|e| e.to_string())?;
    let mut failures = Vec::new();
    for case in cases() {
        let k = case.kernel;
        let want = run_case(&host, &read(&dir.join(format!("{k}.host.so")))?, &case)
            .map_err(|e| format!("{k} on the host: {e}"))?;
        let ptx = read(&dir.join(format!("{k}.ptx")))?;
        let base_cubin = read(&dir.join(format!("{k}.{BASE_SM}.cubin")))?;
        let own_cubin = read(&dir.join(format!("{k}.{sm}.cubin"))).ok();
        let mut entries: Vec<(EntryKind, u32, &[u8])> = vec![
            (EntryKind::Ptx, 80, &ptx),
            (EntryKind::Cubin, 80, &base_cubin),
        ];
        if let Some(c) = &own_cubin {
            entries.push((EntryKind::Cubin, sm.number(), c));
        }
        let fat = fatbin::build(&entries);
        let mut kinds: Vec<(String, Vec<u8>)> = Vec::new();
        match &own_cubin {
            Some(c) => kinds.push((format!("cubin {sm}"), c.clone())),
            None => println!("{k:10} no cubin prepared for {sm}: the fatbin gives it PTX"),
        }
        kinds.push((format!("PTX {BASE_SM}"), ptx.clone()));
        kinds.push(("fatbin".into(), fat));
        kinds.push((
            format!("bitcode {BASE_SM}"),
            read(&dir.join(format!("{k}.bc")))?,
        ));
        for (kind, image) in kinds {
            let before = jit.jit_stats();
            let t = Instant::now();
            let got = run_case(&gpu, &image, &case);
            let ms = t.elapsed().as_secs_f64() * 1e3;
            let jit_ms = match (before, jit.jit_stats()) {
                (Some(b), Some(a)) if a.compiles > b.compiles => {
                    format!(", JIT {:.1} ms", (a.compile_ns - b.compile_ns) as f64 / 1e6)
                }
                _ => String::new(),
            };
            match got {
                Ok(got) if got == want => {
                    println!("{k:10} {kind:14} matches the host bit for bit ({ms:.1} ms{jit_ms})")
                }
                Ok(got) => {
                    let which: Vec<usize> = (0..got.len()).filter(|&i| got[i] != want[i]).collect();
                    println!("{k:10} {kind:14} DIFFERS from the host in buffer(s) {which:?}");
                    failures.push(format!("{k} from {kind}: buffers {which:?} differ"));
                }
                Err(e) => {
                    println!("{k:10} {kind:14} FAILED: {e}");
                    failures.push(format!("{k} from {kind}: {e}"));
                }
            }
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
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

/// The offload side of the launch benchmark: the empty kernel's cubin on `cuda:0`, launched
/// `n` times synchronously, then `n` times on a queue with one wait; per-launch µs of each.
pub fn offload_launch_us(
    runtime: &offload::Runtime,
    cubin: &[u8],
    n: u32,
) -> Result<(f64, f64), String> {
    let gpu = runtime.device("cuda", 0).map_err(|e| e.to_string())?;
    let program = gpu.load(cubin).map_err(|e| e.to_string())?;
    let kernel = program.kernel("empty").map_err(|e| e.to_string())?;
    let dims = LaunchDims::linear(1, 1);
    let sync = per_call_us(n, || program.launch(kernel, &dims, &[]).unwrap());
    let raw = gpu.raw();
    let queue = raw.queue_create().map_err(|e| e.to_string())?;
    let queued = per_call_us(1, || {
        for _ in 0..n {
            raw.launch(kernel.handle(), &dims, &[], Some(queue))
                .unwrap();
        }
        raw.queue_synchronize(queue).unwrap();
    }) / f64::from(n);
    raw.queue_destroy(queue).map_err(|e| e.to_string())?;
    Ok((sync, queued))
}
