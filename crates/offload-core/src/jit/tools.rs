//! The tools post-processing runs, found by one rule for the worker (which runs them) and the
//! JIT client (which names them in disk-cache keys).

use crate::error::{Error, Result};

/// Variable naming the `ld.lld` that links JIT output (host and AMDGPU images).
pub const ENV_LLD: &str = "OFFLOAD_LLD";
/// Where the linker is looked for when [`ENV_LLD`] is unset, in order: LLVM 19's own, then on
/// `PATH` ([`locate_lld`]).
pub const LLD_CANDIDATES: [&str; 3] = ["/usr/lib/llvm-19/bin/ld.lld", "ld.lld-19", "ld.lld"];

/// The file `name` names: itself when it holds a `/`, else the first match in `PATH`'s
/// directories ([`crate::fs::path_dirs`]); only a regular file (or a link to one).
fn on_path(name: &str) -> Option<std::path::PathBuf> {
    if name.contains('/') {
        return Some(std::path::PathBuf::from(name)).filter(|p| p.is_file());
    }
    crate::fs::path_dirs()
        .into_iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The `ld.lld` that links JIT output: the file [`ENV_LLD`] names (a path, or a name on
/// `PATH`), else the first of [`LLD_CANDIDATES`] that exists. The one rule for both sides: the
/// worker runs this file (and refuses it if it does not answer `--version` as LLD), the JIT
/// client stamps this file into disk-cache keys. Looking does not run anything.
pub fn locate_lld() -> Result<std::path::PathBuf> {
    if let Some((name, value)) = crate::env::raw(&[ENV_LLD])? {
        return on_path(&value).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "environment variable {name}='{value}' is not valid: no such file{}",
                if value.contains('/') { "" } else { " on PATH" }
            ))
        });
    }
    LLD_CANDIDATES
        .iter()
        .find_map(|c| on_path(c))
        .ok_or_else(|| {
            Error::Unsupported(format!(
                "linking JIT output needs ld.lld from LLVM 19 (looked for {}; set {ENV_LLD}); \
                 install lld-19",
                LLD_CANDIDATES.join(", ")
            ))
        })
}

/// Variable naming the directory of LLVM's OpenMP device runtimes (default: the LLVM library
/// directory the JIT was built against).
pub const ENV_DEVICE_RUNTIME_DIR: &str = "OFFLOAD_OMP_DEVICE_RTL_DIR";

/// The file name of LLVM's OpenMP device runtime for a GPU target, as LLVM 19 installs them:
/// `libomptarget-nvptx-sm_90.bc` (an `sm_90a` device runs the `sm_90` runtime: the
/// architecture-specific features are a superset), `libomptarget-amdgpu-gfx90a.bc` (target
/// features such as `:xnack+` are not part of the name). `None` for other triples and for a
/// processor name that is not one (a name is only letters, digits and `_`).
pub fn openmp_device_runtime_name(triple: &str, cpu: &str) -> Option<String> {
    let arch = triple.split('-').next().unwrap_or_default();
    let cpu = cpu.split(':').next().unwrap_or_default();
    if cpu.is_empty() || !cpu.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return None;
    }
    match arch {
        "nvptx64" | "nvptx" => {
            let base = cpu.strip_suffix('a').filter(|b| b.starts_with("sm_"));
            Some(format!("libomptarget-nvptx-{}.bc", base.unwrap_or(cpu)))
        }
        "amdgcn" => Some(format!("libomptarget-amdgpu-{cpu}.bc")),
        _ => None,
    }
}

/// The OpenMP device runtime for `triple`/`cpu` in `dir` ([`openmp_device_runtime_name`]), if
/// that file exists. One rule for the worker (which links it) and the JIT client (which stamps
/// it into cache keys).
pub fn openmp_device_runtime(
    dir: &std::path::Path,
    triple: &str,
    cpu: &str,
) -> Option<std::path::PathBuf> {
    let path = dir.join(openmp_device_runtime_name(triple, cpu)?);
    path.is_file().then_some(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_runtime_names() {
        for (triple, cpu, want) in [
            (
                "nvptx64-nvidia-cuda",
                "sm_90",
                Some("libomptarget-nvptx-sm_90.bc"),
            ),
            (
                "nvptx64-nvidia-cuda",
                "sm_90a",
                Some("libomptarget-nvptx-sm_90.bc"),
            ),
            ("nvptx64", "sm_80", Some("libomptarget-nvptx-sm_80.bc")),
            (
                "amdgcn-amd-amdhsa",
                "gfx90a",
                Some("libomptarget-amdgpu-gfx90a.bc"),
            ),
            (
                "amdgcn-amd-amdhsa",
                "gfx90a:xnack+",
                Some("libomptarget-amdgpu-gfx90a.bc"),
            ),
            ("x86_64-unknown-linux-gnu", "znver3", None),
            ("nvptx64-nvidia-cuda", "", None),
            ("nvptx64-nvidia-cuda", "../../etc/passwd", None),
            ("amdgcn-amd-amdhsa", "gfx90a/x", None),
        ] {
            assert_eq!(
                openmp_device_runtime_name(triple, cpu).as_deref(),
                want,
                "{triple} {cpu}"
            );
        }
    }
}
