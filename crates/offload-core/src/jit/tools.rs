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
