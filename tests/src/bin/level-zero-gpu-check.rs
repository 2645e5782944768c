//! The Level Zero GPU check (see `tests/src/level_zero_check.rs` and `scripts/gpu-check.sh`).
//!
//!     level-zero-gpu-check prepare DIR     where the build tools are: writes the images
//!     level-zero-gpu-check run DIR         where the GPU is: the kernels against the host, and
//!                                          the checks beyond them
//!
//! The plugins are looked for next to this executable.

#[path = "../level_zero_check.rs"]
mod level_zero_check;

use std::path::PathBuf;
use std::process::ExitCode;

fn run(dir: PathBuf) -> Result<(), String> {
    let (exe_dir, runtime) = offload_tests::gpu_check::runtime_beside_exe()?;
    let report = level_zero_check::run(&dir, &runtime, &exe_dir.join("offload"))?;
    offload_tests::gpu_check::finish(&report, &runtime, "level-zero", &dir)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["prepare", dir] => level_zero_check::prepare(&PathBuf::from(dir)),
        ["run", dir] => run(PathBuf::from(dir)),
        _ => {
            eprintln!("usage: level-zero-gpu-check prepare DIR | run DIR");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("level-zero-gpu-check: {e}");
            ExitCode::FAILURE
        }
    }
}
