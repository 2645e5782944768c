//! `offload jit IMAGE --target TRIPLE --cpu CPU [--features F] [-O N] -o OUT`
//!
//! Compiles through the same JIT client and worker process as the plugins, so an input that
//! crashes LLVM is an error here too, never a crash of this process.

use super::out::outln;
use super::{Failure, human_bytes, ms_since};
use offload_core::jit::{CompileRequest, JitService, JitTarget, PostProcess};
use offload_jit_client::{JitClient, JitConfig};
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct JitArgs {
    /// LLVM bitcode or textual IR.
    image: PathBuf,
    /// Target triple (nvptx64-nvidia-cuda, amdgcn-amd-amdhsa, x86_64-unknown-linux-gnu, ...).
    #[arg(long)]
    target: String,
    /// Exact CPU / compute-unit kind (sm_90, gfx90a, znver3, x86-64).
    #[arg(long)]
    cpu: String,
    /// LLVM target features, comma-separated: +name enables, -name disables, a bare name
    /// enables (as llc -mattr).
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    features: String,
    /// Optimisation level (default: OFFLOAD_JIT_OPT_LEVEL, else 3).
    #[arg(short = 'O', value_parser = clap::value_parser!(u8).range(0..=3))]
    opt: Option<u8>,
    /// Output file.
    #[arg(short = 'o')]
    output: PathBuf,
    /// For nvptx64: write the PTX the JIT generates (identical to `opt-19 | llc-19`) instead of
    /// the cubin `ptxas` makes of it.
    #[arg(long)]
    emit_ptx: bool,
    /// Print one JSON object (what was written, by which post-processing step, how long).
    #[arg(long)]
    json: bool,
}

/// What the plugin for `triple` would do after code generation (and, for nvptx64 without
/// ptxas, why the output is PTX).
fn post_process_for(
    triple: &str,
    cpu: &str,
    emit_ptx: bool,
) -> Result<(PostProcess, Option<&'static str>), Failure> {
    if !PostProcess::takes_ptxas(triple) || emit_ptx {
        return Ok((PostProcess::for_target(triple, cpu, None), None));
    }
    Ok(match offload_jit_client::ptxas::find()? {
        Some(p) => (
            PostProcess::for_target(triple, cpu, Some((&p.path, &p.version))),
            None,
        ),
        None => (
            PostProcess::for_target(triple, cpu, None),
            Some(
                "no ptxas found (OFFLOAD_PTXAS, PATH, CUDA_HOME, /usr/local/cuda): PTX, as the plugin would hand it to the driver's JIT",
            ),
        ),
    })
}

pub fn jit(a: JitArgs) -> Result<(), Failure> {
    offload::diagnostics::init(None).map_err(Failure::input)?;
    let _progress = super::progress::start(a.json);
    let image = offload_core::fs::read_regular(&a.image, "image").map_err(Failure::input)?;
    if !offload_jit_client::is_jit_input(&image) {
        return Err(Failure::Usage(format!(
            "'{}' is neither LLVM bitcode nor textual IR",
            a.image.display()
        )));
    }
    let mut config = JitConfig::from_env()?;
    if let Some(o) = a.opt {
        config.options.opt_level = o;
    }
    let opt_level = config.options.opt_level;
    let shown = a.image.display();
    let module_triple = offload_core::image::bitcode::module_triple(&image)
        .map_err(|e| e.context(format!("image '{shown}'")))?;
    if !module_triple.is_empty()
        && !offload_core::image::triple::triples_match(&module_triple, &a.target)
    {
        return Err(Failure::Runtime(format!(
            "image '{shown}': bitcode is for '{module_triple}', not '{}'",
            a.target
        )));
    }
    let client = JitClient::new(
        Ok(config),
        offload::default_plugin_dirs().unwrap_or_default(),
    );
    if a.emit_ptx && !a.target.starts_with("nvptx") {
        return Err(Failure::Usage(format!(
            "--emit-ptx is for nvptx64 targets, not '{}'",
            a.target
        )));
    }
    let (post, note) = post_process_for(&a.target, &a.cpu, a.emit_ptx)?;
    let kind = match note {
        Some(n) => format!("{}; {n}", post.describe(&a.target)),
        None => post.describe(&a.target).to_string(),
    };
    let post_json = match &post {
        PostProcess::Ptxas {
            path,
            version,
            arch,
        } => serde_json::json!({"step": "ptxas", "path": path, "version": version, "arch": arch}),
        PostProcess::Unchanged => serde_json::json!({"step": "none", "note": note}),
        PostProcess::LinkHostSharedObject => serde_json::json!({"step": "link-host-shared-object"}),
        PostProcess::LinkAmdgpuCodeObject { gfx } => {
            serde_json::json!({"step": "link-amdgpu-code-object", "arch": gfx})
        }
    };
    let request = CompileRequest {
        image: &image,
        target: JitTarget {
            triple: a.target.clone(),
            cpu: a.cpu.clone(),
            features: a.features.clone(),
        },
        post: post.clone(),
    };
    let t = Instant::now();
    let out = client
        .compile(&request)
        .map_err(|e| e.context(format!("image '{shown}' for {} {}", a.target, a.cpu)))?;
    let compile_ms = ms_since(t);
    std::fs::write(&a.output, &out.image.bytes)
        .map_err(|e| Failure::Runtime(format!("cannot write '{}': {e}", a.output.display())))?;
    if a.json {
        outln!(
            "{}",
            serde_json::json!({
                "output": a.output.display().to_string(),
                "bytes": out.image.bytes.len(),
                "kind": post.describe(&a.target),
                "post_process": post_json,
                "target": a.target,
                "cpu": a.cpu,
                "opt_level": opt_level,
                "compile_ms": compile_ms,
                // "compiled", or "disk" / "remote" when a cache had it (no worker was started).
                "served": match out.served {
                    offload_core::jit::Served::DiskHit => "disk",
                    offload_core::jit::Served::RemoteHit => "remote",
                    _ => "compiled",
                },
            })
        );
        return Ok(());
    }
    outln!(
        "wrote {} ({}, {}) for {} {} at -O{} in {:.3} ms{}",
        a.output.display(),
        kind,
        human_bytes(out.image.bytes.len() as u64),
        a.target,
        a.cpu,
        opt_level,
        compile_ms,
        match out.served {
            offload_core::jit::Served::DiskHit => " (from the disk cache)",
            offload_core::jit::Served::RemoteHit => " (from the remote cache)",
            _ => "",
        }
    );
    Ok(())
}
