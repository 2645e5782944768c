//! `offload jit IMAGE --target TRIPLE --cpu CPU [--features F] [-O N] -o OUT`

use super::{Failure, human_bytes, ms_since};
use offload_jit::{JitConfig, JitEngine, JitTarget, LinkSharedObject, PostProcess, Unchanged};
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
    /// LLVM target features (e.g. +ptx80).
    #[arg(long, default_value = "")]
    features: String,
    /// Optimisation level (default: OFFLOAD_JIT_OPT_LEVEL, else 3).
    #[arg(short = 'O', value_parser = clap::value_parser!(u8).range(0..=3))]
    opt: Option<u8>,
    /// Output file.
    #[arg(short = 'o')]
    output: PathBuf,
}

/// What the plugin for `triple` would do after code generation, where this machine can do it.
fn post_process_for(
    triple: &str,
    cpu: &str,
) -> Result<(Box<dyn PostProcess>, &'static str), Failure> {
    let arch = triple.split('-').next().unwrap_or("");
    let linked =
        |p: offload_core::Result<LinkSharedObject>| -> Result<Box<dyn PostProcess>, Failure> {
            Ok(Box::new(p.map_err(|e| Failure::Runtime(e.to_string()))?))
        };
    Ok(match arch {
        "nvptx64" | "nvptx" => (Box::new(Unchanged), "PTX text"),
        "amdgcn" => (
            linked(LinkSharedObject::amdgpu(cpu))?,
            "linked AMDGPU code object",
        ),
        _ if triple.contains("linux") => {
            (linked(LinkSharedObject::host())?, "linked shared object")
        }
        _ => (Box::new(Unchanged), "object file"),
    })
}

pub fn jit(a: JitArgs) -> Result<(), Failure> {
    let image = std::fs::read(&a.image)
        .map_err(|e| Failure::Usage(format!("cannot read image '{}': {e}", a.image.display())))?;
    if !JitEngine::is_jit_input(&image) {
        return Err(Failure::Usage(format!(
            "'{}' is neither LLVM bitcode nor textual IR",
            a.image.display()
        )));
    }
    let mut config = JitConfig::from_env()?;
    if let Some(o) = a.opt {
        config.opt_level = o;
    }
    let engine = JitEngine::with_config(&a.target, config)?;
    let (post, kind) = post_process_for(engine.triple(), &a.cpu)?;
    let target = JitTarget {
        compute_unit_kind: a.cpu.clone(),
        features: a.features.clone(),
    };
    let t = Instant::now();
    engine
        .check_image(&image)
        .map_err(|e| e.context(format!("image '{}'", a.image.display())))?;
    let out = engine
        .compile(&image, &target, post.as_ref())
        .map_err(|e| {
            e.context(format!(
                "image '{}' for {} {}",
                a.image.display(),
                engine.triple(),
                a.cpu
            ))
        })?;
    std::fs::write(&a.output, &out.image.bytes)
        .map_err(|e| Failure::Runtime(format!("cannot write '{}': {e}", a.output.display())))?;
    println!(
        "wrote {} ({}, {}) for {} {} at -O{} in {:.3} ms",
        a.output.display(),
        kind,
        human_bytes(out.image.bytes.len() as u64),
        engine.triple(),
        a.cpu,
        engine.config().opt_level,
        ms_since(t)
    );
    Ok(())
}
