//! `offload jit IMAGE --target TRIPLE --cpu CPU [--features F] [-O N] -o OUT`
//!
//! Compiles through the same JIT client and worker process as the plugins, so an input that
//! crashes LLVM is an error here too, never a crash of this process.

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
}

/// What the plugin for `triple` would do after code generation.
fn post_process_for(triple: &str, cpu: &str) -> PostProcess {
    let arch = triple.split('-').next().unwrap_or("");
    match arch {
        "nvptx64" | "nvptx" => PostProcess::Unchanged,
        "amdgcn" => PostProcess::LinkAmdgpuCodeObject { gfx: cpu.into() },
        _ if triple.contains("linux") => PostProcess::LinkHostSharedObject,
        _ => PostProcess::Unchanged,
    }
}

pub fn jit(a: JitArgs) -> Result<(), Failure> {
    let image = std::fs::read(&a.image)
        .map_err(|e| Failure::Usage(format!("cannot read image '{}': {e}", a.image.display())))?;
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
    let module_triple = offload_core::bitcode::module_triple(&image)
        .map_err(|e| e.context(format!("image '{shown}'")))?;
    if !module_triple.is_empty() && !offload_core::triple::triples_match(&module_triple, &a.target)
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
    let post = post_process_for(&a.target, &a.cpu);
    let kind = post.describe(&a.target);
    let request = CompileRequest {
        image: &image,
        target: JitTarget {
            triple: a.target.clone(),
            cpu: a.cpu.clone(),
            features: a.features.clone(),
        },
        post,
    };
    let t = Instant::now();
    let out = client
        .compile(&request)
        .map_err(|e| e.context(format!("image '{shown}' for {} {}", a.target, a.cpu)))?;
    std::fs::write(&a.output, &out.image.bytes)
        .map_err(|e| Failure::Runtime(format!("cannot write '{}': {e}", a.output.display())))?;
    println!(
        "wrote {} ({}, {}) for {} {} at -O{} in {:.3} ms",
        a.output.display(),
        kind,
        human_bytes(out.image.bytes.len() as u64),
        a.target,
        a.cpu,
        opt_level,
        ms_since(t)
    );
    Ok(())
}
