//! Finding NVIDIA's `ptxas`, which turns the JIT's PTX into a cubin: `OFFLOAD_PTXAS`, then
//! `ptxas` on `PATH`, then a CUDA installation (`$CUDA_HOME`, `$CUDA_PATH`,
//! `/usr/local/cuda`). Without one, bitcode still runs: its PTX goes to the driver's own JIT
//! (which `offload info` says).

use offload_core::{Error, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Variable naming the `ptxas` to use.
pub const ENV_PTXAS: &str = "OFFLOAD_PTXAS";

/// A `ptxas` that answered `--version`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ptxas {
    /// Absolute path.
    pub path: String,
    /// Its version line (`release 12.9, V12.9.86`).
    pub version: String,
}

fn probe(path: &Path) -> Option<Ptxas> {
    let out = Command::new(path)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !text.contains("Cuda compilation tools") {
        return None;
    }
    let version = text
        .lines()
        .find(|l| l.contains("release"))
        .map(|l| {
            l.trim()
                .trim_start_matches("Cuda compilation tools, ")
                .to_string()
        })
        .unwrap_or_else(|| text.lines().last().unwrap_or("").trim().to_string());
    let path = std::path::absolute(path).ok()?;
    Some(Ptxas {
        path: path.display().to_string(),
        version,
    })
}

/// Finds `ptxas`; `Ok(None)` when there is none, an error when `OFFLOAD_PTXAS` names something
/// that is not one.
pub fn find() -> Result<Option<Ptxas>> {
    if let Some((name, value)) = offload_core::env::raw(&[ENV_PTXAS])? {
        return probe(Path::new(&value)).map(Some).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "environment variable {name}='{value}' is not valid: it is not a ptxas that \
                 answers --version"
            ))
        });
    }
    let mut candidates: Vec<PathBuf> = offload_core::fs::path_dirs()
        .into_iter()
        .map(|d| d.join("ptxas"))
        .collect();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(dir) = offload_core::env::os(var) {
            candidates.push(PathBuf::from(dir).join("bin/ptxas"));
        }
    }
    candidates.push(PathBuf::from("/usr/local/cuda/bin/ptxas"));
    Ok(candidates
        .iter()
        .filter(|c| c.is_file())
        .find_map(|c| probe(c)))
}
