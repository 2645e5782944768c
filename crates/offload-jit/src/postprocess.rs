//! Per-device post-processing of generated code: what turns the code generator's output into
//! what the device loads. Plugins choose one per device; its [`PostProcess::id`] is part of the
//! cache key.

use offload_core::{Error, Result};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

/// Turns generated code into a loadable image.
pub trait PostProcess: Send + Sync {
    /// Identifies the step and its settings (goes into the cache key).
    fn id(&self) -> String;
    /// Runs the step.
    fn run(&self, generated: Vec<u8>) -> Result<Vec<u8>>;
}

/// Hands the generated code over unchanged (PTX for a driver that assembles it itself, or an
/// object for a caller that links it).
#[derive(Debug, Default, Clone, Copy)]
pub struct Unchanged;

impl PostProcess for Unchanged {
    fn id(&self) -> String {
        "unchanged".into()
    }
    fn run(&self, generated: Vec<u8>) -> Result<Vec<u8>> {
        Ok(generated)
    }
}

/// Finds `ld.lld-19` (PATH, then LLVM 19's bin directory, then plain `ld.lld`).
pub fn find_lld() -> Result<PathBuf> {
    let candidates = ["ld.lld-19", "/usr/lib/llvm-19/bin/ld.lld", "ld.lld"];
    for c in candidates {
        if Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return Ok(PathBuf::from(c));
        }
    }
    Err(Error::Unsupported(format!(
        "linking JIT output needs ld.lld from LLVM 19 (tried {}); install lld-19",
        candidates.join(", ")
    )))
}

/// Links the object into a shared object with lld (host images; AMDGPU code objects).
#[derive(Debug, Clone)]
pub struct LinkSharedObject {
    lld: PathBuf,
    args: Vec<String>,
}

impl LinkSharedObject {
    /// `ld.lld -shared ARGS -o OUT IN`.
    pub fn new(args: &[&str]) -> Result<Self> {
        Ok(LinkSharedObject {
            lld: find_lld()?,
            args: args.iter().map(|s| s.to_string()).collect(),
        })
    }

    /// For the host CPU: undefined symbols (libc) resolve when the image is loaded.
    pub fn host() -> Result<Self> {
        Self::new(&[])
    }

    /// For AMD GPUs, as upstream links JIT output: no undefined symbols allowed.
    pub fn amdgpu(gfx: &str) -> Result<Self> {
        Self::new(&["--no-undefined", &format!("-plugin-opt=mcpu={gfx}")])
    }
}

/// Temporary files removed on drop, also on error paths.
struct TempFiles(Vec<PathBuf>);

impl Drop for TempFiles {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl PostProcess for LinkSharedObject {
    fn id(&self) -> String {
        format!("lld-shared {}", self.args.join(" "))
    }

    fn run(&self, generated: Vec<u8>) -> Result<Vec<u8>> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let base = std::env::temp_dir().join(format!("offload-jit-{}-{n}", std::process::id()));
        let (input, output) = (base.with_extension("o"), base.with_extension("so"));
        let _cleanup = TempFiles(vec![input.clone(), output.clone()]);
        std::fs::write(&input, &generated).map_err(|e| {
            Error::System(format!("writing '{}' for the linker: {e}", input.display()))
        })?;
        let out = Command::new(&self.lld)
            .arg("-shared")
            .args(&self.args)
            .arg("-o")
            .arg(&output)
            .arg(&input)
            .output()
            .map_err(|e| Error::System(format!("running {}: {e}", self.lld.display())))?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            // lld repeats an error per reference; the distinct error lines say it all.
            let mut errors: Vec<&str> = Vec::new();
            for line in stderr.lines().filter(|l| l.contains("error:")) {
                if !errors.contains(&line) {
                    errors.push(line);
                }
            }
            let hint = if stderr.contains("cannot be used with -shared") || stderr.contains("-fPIC")
            {
                " (the input was not compiled as position-independent code: build host bitcode \
                 with clang -fPIC -emit-llvm)"
            } else {
                ""
            };
            return Err(Error::CompileFailure(format!(
                "linking the generated object with {} failed: {}{hint}",
                self.lld.display(),
                errors.join("; ")
            )));
        }
        std::fs::read(&output).map_err(|e| {
            Error::System(format!("reading linker output '{}': {e}", output.display()))
        })
    }
}
