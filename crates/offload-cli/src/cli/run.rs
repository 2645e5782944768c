//! `offload run IMAGE --kernel NAME ...`

use super::Failure;
use super::args::{self, ArgSpec};
use super::out::outln;
use offload::diagnostics::phase;
use offload::{DeviceBuffer, KernelArg, LaunchDims, Runtime, ScalarType};
use serde_json::json;
use std::path::PathBuf;
use std::time::Instant;

/// How many leading elements of each buffer are shown.
const SHOWN: usize = 8;

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Device image (host/GPU ELF shared object).
    image: PathBuf,
    /// Kernel to launch.
    #[arg(long)]
    kernel: String,
    /// Device as PLUGIN:INDEX, or a remote device by its address (mpi:1/host:0); default:
    /// picked by the image.
    #[arg(long, value_parser = args::parse_device)]
    device: Option<String>,
    /// Blocks per grid: X[,Y[,Z]].
    #[arg(long, value_parser = args::parse_dims, default_value = "1")]
    grid: [u32; 3],
    /// Threads per block: X[,Y[,Z]].
    #[arg(long, value_parser = args::parse_dims, default_value = "1")]
    block: [u32; 3],
    /// Kernel argument, in order: TYPE:V (i32 u32 i64 u64 f32 f64) or buf:TYPE:LEN[:INIT]
    /// with INIT zero (default), fill=V, iota or file=PATH.
    #[arg(long = "arg", value_parser = args::parse_arg_spec)]
    args: Vec<ArgSpec>,
    /// Write the final contents of argument i to DIR/arg<i>.bin.
    #[arg(long)]
    dump: Option<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// Dynamic shared memory per block, in bytes (the kernel's offload_shared_memory()).
    #[arg(long = "shared-mem", default_value_t = 0)]
    shared_mem: u32,
    /// Stop a launch that runs longer than SECONDS (exit 1; the process ends, which stops the
    /// device's threads).
    #[arg(long, value_parser = args::parse_timeout)]
    timeout: Option<std::time::Duration>,
    /// Write a Chrome trace-event profile of the run to FILE (as OFFLOAD_PROFILE does; opens
    /// in Perfetto or chrome://tracing).
    #[arg(long)]
    profile: Option<PathBuf>,
}

struct BufferArg {
    index: usize,
    ty: ScalarType,
    len: usize,
    host: Vec<u8>,
    device: Option<DeviceBuffer>,
}

pub fn run(a: RunArgs) -> Result<(), Failure> {
    // The profile's time origin first, so that the whole run lies after it.
    offload_core::diag::epoch();
    let total = Instant::now();
    offload::diagnostics::init(a.profile.clone()).map_err(Failure::input)?;
    let outcome = run_traced(a, total);
    // The profile is written even when the run failed (it shows how far it got).
    offload::diagnostics::flush_profile().map_err(|e| Failure::Runtime(e.to_string()))?;
    outcome
}

fn run_traced(a: RunArgs, total: Instant) -> Result<(), Failure> {
    let _progress = super::progress::start(a.json);
    // Everything that can be wrong with the command line or input files is found here,
    // before any device is touched (exit status 2).
    let image = offload_core::fs::read_regular(&a.image, "image").map_err(Failure::input)?;
    let mut buffers = Vec::new();
    for (i, spec) in a.args.iter().enumerate() {
        if let ArgSpec::Buffer { ty, len, init } = spec {
            let host = args::initial_bytes(*ty, *len, init, i).map_err(Failure::Usage)?;
            buffers.push(BufferArg {
                index: i,
                ty: *ty,
                len: *len,
                host,
                device: None,
            });
        }
    }
    if let Some(dir) = &a.dump {
        std::fs::create_dir_all(dir).map_err(|e| {
            Failure::Usage(format!(
                "cannot create dump directory '{}': {e}",
                dir.display()
            ))
        })?;
    }

    let rt = Runtime::from_env().map_err(Failure::input)?;
    let t = Instant::now();
    let device = match &a.device {
        Some(spec) => rt.device_by_spec(spec)?,
        None => rt
            .route(&image)
            .map_err(|e| e.context(format!("image '{}'", a.image.display())))?,
    };
    let slot = rt.plugin(device.plugin_name())?;
    let jit_before = slot.jit_stats();
    let disk_before = rt.jit().disk_hits_for(device.plugin_name());
    let remote_before = rt.jit().remote_hits_for(device.plugin_name());
    // SAFETY: `offload run` runs the image its user names, as a shell runs the program it is
    // given: the user trusts it (docs/cli.md says so).
    let program = unsafe { device.load_trusted(&image) }
        .map_err(|e| e.context(format!("image '{}' on {device}", a.image.display())))?;
    let kernel = program.kernel(&a.kernel)?;
    let load_ms = phase("load", t, Instant::now());

    let t = Instant::now();
    for b in &mut buffers {
        let buf = device.alloc_buffer(b.host.len() as u64)?;
        buf.write(&b.host)?;
        b.device = Some(buf);
    }
    let copy_in_ms = phase("copy_in", t, Instant::now());

    let mut kernel_args = Vec::with_capacity(a.args.len());
    let mut next_buffer = buffers.iter();
    for spec in &a.args {
        kernel_args.push(match spec {
            ArgSpec::Scalar(v) => *v,
            ArgSpec::Buffer { .. } => {
                let b = next_buffer.next().expect("one BufferArg per buffer spec");
                KernelArg::Ptr(b.device.as_ref().expect("allocated above").ptr())
            }
        });
    }
    let dims = LaunchDims {
        grid: a.grid,
        block: a.block,
        shared_mem_bytes: a.shared_mem,
    };
    check_against_record(&kernel, &a.args, &kernel_args)?;
    let t = Instant::now();
    let watchdog = a.timeout.map(|limit| {
        let (done, wait) = std::sync::mpsc::channel::<()>();
        let what = format!("launch of '{}' ({dims}) on {device}", a.kernel);
        std::thread::spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = wait.recv_timeout(limit) {
                super::out::error_line(&format!(
                    "offload: error: {what} did not finish within {} s (--timeout); stopped",
                    limit.as_secs_f64()
                ));
                std::process::exit(1);
            }
        });
        done
    });
    // SAFETY: `offload run` launches what its user states, as upstream's tools do: the layer
    // checks the shape and, on the host, that pointers point into live allocations (the
    // buffers above, each as large as the user asked); how far the kernel goes from them is
    // the user's statement (a host kernel that faults is an error of this launch).
    unsafe { kernel.launch(dims).args_raw(&kernel_args).unchecked().run() }
        .map_err(|e| e.context(format!("launch of '{}' ({dims}) on {device}", a.kernel)))?;
    drop(watchdog);
    let launch_ms = phase("launch", t, Instant::now());

    let t = Instant::now();
    for b in &mut buffers {
        b.device
            .as_ref()
            .expect("allocated above")
            .read(&mut b.host)?;
    }
    let copy_out_ms = phase("copy_out", t, Instant::now());

    if let Some(dir) = &a.dump {
        for (i, spec) in a.args.iter().enumerate() {
            let bytes = match spec {
                ArgSpec::Scalar(v) => {
                    let (_, bits) = v.to_bits();
                    bits.to_le_bytes()[..v.size()].to_vec()
                }
                ArgSpec::Buffer { .. } => buffers
                    .iter()
                    .find(|b| b.index == i)
                    .expect("buffer exists")
                    .host
                    .clone(),
            };
            let path = dir.join(format!("arg{i}.bin"));
            std::fs::write(&path, bytes)
                .map_err(|e| Failure::Runtime(format!("cannot write '{}': {e}", path.display())))?;
        }
    }
    drop(program);
    let total_ms = phase("total", total, Instant::now());
    // What the JIT did for this run (null for plugins without one).
    let jit = match (jit_before, slot.jit_stats()) {
        (Some(b), Some(a)) => Some((
            a.compiles - b.compiles,
            a.memory_hits - b.memory_hits,
            (a.compile_ns - b.compile_ns) as f64 / 1e6,
        )),
        _ => None,
    };
    let disk_hits = rt.jit().disk_hits_for(device.plugin_name()) - disk_before;
    let remote_hits = rt.jit().remote_hits_for(device.plugin_name()) - remote_before;
    let worker_started = rt.jit().worker_stats().starts > 0;

    let info = device.info()?;
    let post_process = slot
        .properties()
        .and_then(|p| p.into_iter().find(|(k, _)| k == "bitcode"))
        .map(|(_, v)| v);
    if a.json {
        let out = json!({
            "device": device.to_string(),
            "device_name": info.name,
            "compute_unit": info.compute_unit_kind,
            "kernel": a.kernel,
            "grid": a.grid,
            "block": a.block,
            "timings_ms": {
                "load": load_ms, "copy_in": copy_in_ms, "launch": launch_ms,
                "copy_out": copy_out_ms, "total": total_ms,
            },
            "jit": jit.map(|(compiles, memory_hits, compile_ms)| json!({
                "compiles": compiles, "memory_hits": memory_hits, "disk_hits": disk_hits,
                "remote_hits": remote_hits,
                "compile_ms": compile_ms,
                // Whether this process started a JIT worker (none when every image was cached).
                "worker_started": worker_started,
                // What the plugin does with the JIT's output (ptxas, the driver's JIT, a link).
                "post_process": post_process,
            })),
            "buffers": buffers.iter().map(|b| json!({
                "arg": b.index,
                "type": b.ty.name(),
                "len": b.len,
                "head": (0..b.len.min(SHOWN)).map(|i| args::element_json(b.ty, &b.host, i)).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        });
        outln!("{out}");
        return Ok(());
    }
    outln!(
        "device   {device}  {} (compute unit {})",
        info.name,
        info.compute_unit_kind
    );
    outln!("kernel   {}  {dims}", a.kernel);
    for b in &buffers {
        let head: Vec<String> = (0..b.len.min(SHOWN))
            .map(|i| args::element_text(b.ty, &b.host, i))
            .collect();
        outln!(
            "arg{}     {}[{}] = [{}{}]",
            b.index,
            b.ty.name(),
            b.len,
            head.join(", "),
            if b.len > SHOWN { ", ..." } else { "" }
        );
    }
    if let Some((compiles, hits, ms)) = jit.filter(|j| j.0 + j.1 + disk_hits + remote_hits > 0) {
        outln!(
            "jit      {compiles} compile(s), {hits} memory hit(s), {disk_hits} disk hit(s), \
             {remote_hits} remote hit(s), {ms:.3} ms compiling"
        );
    }
    outln!(
        "timings  load {load_ms:.3} ms, copy-in {copy_in_ms:.3} ms, launch {launch_ms:.3} ms, \
         copy-out {copy_out_ms:.3} ms, total {total_ms:.3} ms"
    );
    Ok(())
}

/// With the kernel's `OFFLOAD_PARAMS` record, the command checks what only the record can say:
/// that each buffer holds the extent the record declares for these arguments (a buffer shorter
/// than `[n]` would let the kernel write past it; a negative extent is refused too, since a
/// kernel comparing `i < (unsigned)n` touches the whole grid then). The count and types of
/// the arguments are left to the plugin, which checks them against the kernel's signature and
/// names the argument. Without a record the launch is as the user states it.
fn check_against_record(
    kernel: &offload::Kernel,
    specs: &[ArgSpec],
    args: &[KernelArg],
) -> Result<(), Failure> {
    use offload::ParamKind;
    let Some(Ok(params)) = kernel.params() else {
        return Ok(());
    };
    if params.params.len() != specs.len() {
        return Ok(());
    }
    let value = |i: usize| args.get(i).and_then(KernelArg::integer);
    for (i, (param, spec)) in params.params.iter().zip(specs).enumerate() {
        let (ParamKind::Pointer(p), ArgSpec::Buffer { ty, len, .. }) = (&param.kind, spec) else {
            continue;
        };
        let (Some(extent), Some(elem)) = (&p.extent, p.elem) else {
            continue;
        };
        // An extent over arguments that are not integers is the plugin's to refuse.
        if extent.params().iter().any(|j| value(*j).is_none()) {
            continue;
        }
        let need = extent.eval(&value).map_err(|e| {
            Failure::Runtime(format!(
                "kernel '{}' (its OFFLOAD_PARAMS record): {}: {e}",
                kernel.name(),
                param.describe(i)
            ))
        })?;
        let bytes = need.saturating_mul(elem.size() as u128);
        let have = (*len as u128) * ty.size() as u128;
        if bytes > have {
            return Err(Failure::Runtime(format!(
                "kernel '{}' (its OFFLOAD_PARAMS record): {} may touch {need} element(s) ([{}], \
                 {bytes} bytes); --arg {} holds {have} bytes",
                kernel.name(),
                param.describe(i),
                extent.spelling,
                i + 1
            )));
        }
    }
    Ok(())
}
