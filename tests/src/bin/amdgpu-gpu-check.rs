//! The AMD GPU check (see `tests/src/amdgpu_check.rs` and `scripts/gpu-check.sh`).
//!
//!     amdgpu-gpu-check prepare DIR [GFX,...]   where the build tools are: writes the images
//!     amdgpu-gpu-check run DIR                 where the GPU is: every kernel from every image
//!                                              kind against the host
//!
//! The plugins, the JIT worker and ld.lld are looked for next to this executable.

#[path = "../amdgpu_check.rs"]
mod amdgpu_check;

use std::path::PathBuf;
use std::process::ExitCode;

fn run(dir: PathBuf) -> Result<(), String> {
    let (exe_dir, runtime) = offload_tests::gpu_check::runtime_beside_exe()?;
    let report = amdgpu_check::run(&dir, &runtime, &exe_dir.join("offload"))?;
    if let Ok(slot) = runtime.plugin("amdgpu")
        && let Some(j) = slot.jit_stats()
    {
        println!(
            "JIT      {} compiles in {:.1} ms (the first includes starting the worker)",
            j.compiles,
            j.compile_ns as f64 / 1e6
        );
    }
    offload_tests::gpu_check::finish(&report, &runtime, "amdgpu", &dir)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["prepare", dir] => {
            amdgpu_check::prepare(&PathBuf::from(dir), &amdgpu_check::DEFAULT_PROCESSORS)
        }
        ["prepare", dir, list] => {
            let gfx: Vec<&str> = list.split(',').filter(|s| !s.is_empty()).collect();
            amdgpu_check::prepare(&PathBuf::from(dir), &gfx)
        }
        ["run", dir] => run(PathBuf::from(dir)),
        _ => {
            eprintln!("usage: amdgpu-gpu-check prepare DIR [GFX,...] | run DIR");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("amdgpu-gpu-check: {e}");
            ExitCode::FAILURE
        }
    }
}
