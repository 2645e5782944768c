//! # offload-build
//!
//! Compiles C kernels written with `offload_kernel.h` in a build script, for every target
//! asked, into one container (LLVM offload binaries, one image per target) that
//! `offload::include_kernels!` embeds and `Device::load_trusted` picks from: the host shared object
//! on the host device, PTX on an NVIDIA GPU, a code object on an AMD GPU, bitcode through the
//! JIT wherever nothing native fits.
//!
//! ```no_run
//! // The main of build.rs, in a crate that depends on `offload` (and on `offload-build` as a
//! // build-dependency):
//! offload_build::Build::new()
//!     .file("kernels/saxpy.c")
//!     .target(offload_build::Target::Host)
//!     .target(offload_build::Target::Nvptx("sm_90".into()))
//!     .compile("saxpy")
//!     .unwrap_or_else(|e| panic!("{e}"));
//! // src/main.rs (the trust point: see `offload::Device::load_trusted`):
//! // let program = unsafe { device.load_trusted(offload::include_kernels!("saxpy")) }?;
//! ```
//!
//! The header's directory comes from `DEP_OFFLOAD_INCLUDE`, which cargo sets for the build
//! scripts of crates that depend on `offload` (or [`Build::include`]). The compiler is
//! `$OFFLOAD_KERNEL_CC`, else `clang-19`, else `clang`, else `cc` for host-only builds (GPU
//! targets and bitcode need clang; Debian's
//! `clang-19` has the NVPTX and AMDGPU back ends, and AMD code objects need `ld.lld`, from
//! `lld-19`). Every compiler run is printed on failure with its diagnostics.

use offload_core::image::container::{PackImage, offload_binary};
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A target to compile the kernels for.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Target {
    /// A shared object for the host CPU this build runs on (the host backend).
    Host,
    /// LLVM bitcode for the host: the host backend's JIT compiles it for the exact CPU.
    HostBitcode,
    /// PTX for an NVIDIA GPU of this compute capability (`sm_90`); the driver finishes it.
    Nvptx(String),
    /// A code object for an AMD GPU (`gfx90a`).
    Amdgcn(String),
}

impl Target {
    fn triple(&self) -> String {
        match self {
            Target::Host | Target::HostBitcode => host_triple(),
            Target::Nvptx(_) => "nvptx64-nvidia-cuda".into(),
            Target::Amdgcn(_) => "amdgcn-amd-amdhsa".into(),
        }
    }

    fn arch(&self) -> &str {
        match self {
            Target::Host | Target::HostBitcode => "",
            Target::Nvptx(sm) | Target::Amdgcn(sm) => sm,
        }
    }

    fn file_name(&self, name: &str) -> String {
        match self {
            Target::Host => format!("{name}.host.so"),
            Target::HostBitcode => format!("{name}.host.bc"),
            Target::Nvptx(sm) => format!("{name}.{sm}.ptx"),
            Target::Amdgcn(gfx) => format!("{name}.{gfx}.hsaco"),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Host => f.write_str("the host (shared object)"),
            Target::HostBitcode => f.write_str("the host (bitcode)"),
            Target::Nvptx(sm) => write!(f, "NVPTX {sm}"),
            Target::Amdgcn(gfx) => write!(f, "AMDGPU {gfx}"),
        }
    }
}

/// The triple of the machine the kernels' host images are for: cargo's `TARGET` in a build
/// script, else this build's own.
fn host_triple() -> String {
    offload_core::env::raw(&["TARGET"])
        .ok()
        .flatten()
        .map(|(_, t)| t)
        .unwrap_or_else(|| {
            format!(
                "{}-unknown-linux-gnu",
                if cfg!(target_arch = "aarch64") {
                    "aarch64"
                } else {
                    "x86_64"
                }
            )
        })
}

/// Why a build failed.
#[derive(Debug)]
pub struct Error(String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

/// Kernels to compile ([`Build::new`]).
#[derive(Debug, Clone, Default)]
pub struct Build {
    files: Vec<PathBuf>,
    targets: Vec<Target>,
    includes: Vec<PathBuf>,
    defines: Vec<(String, Option<String>)>,
    flags: Vec<String>,
    compiler: Option<String>,
    opt: Option<String>,
}

impl Build {
    /// No files yet; the targets are [`Target::Host`] unless others are added.
    pub fn new() -> Build {
        Build::default()
    }

    /// A C source file of kernels (several are linked into one image per target).
    pub fn file(mut self, path: impl Into<PathBuf>) -> Build {
        self.files.push(path.into());
        self
    }

    /// A target to compile for (the first call replaces the default, [`Target::Host`]).
    pub fn target(mut self, target: Target) -> Build {
        self.targets.push(target);
        self
    }

    /// Another include directory (the kernel header's is added by itself).
    pub fn include(mut self, dir: impl Into<PathBuf>) -> Build {
        self.includes.push(dir.into());
        self
    }

    /// `-D name[=value]`.
    pub fn define(mut self, name: &str, value: Option<&str>) -> Build {
        self.defines
            .push((name.to_string(), value.map(str::to_string)));
        self
    }

    /// Another compiler flag, for every target (`-Wall`, `-Werror`).
    pub fn flag(mut self, flag: &str) -> Build {
        self.flags.push(flag.to_string());
        self
    }

    /// The C compiler (default: `$OFFLOAD_KERNEL_CC`, else `clang-19`, else `clang`, else, when
    /// every target is [`Target::Host`], `cc`).
    pub fn compiler(mut self, cc: &str) -> Build {
        self.compiler = Some(cc.to_string());
        self
    }

    /// The optimisation flag (default `-O2`).
    pub fn opt_level(mut self, flag: &str) -> Build {
        self.opt = Some(flag.to_string());
        self
    }

    /// In a build script: compiles into `$OUT_DIR/<name>.offload` (what
    /// `offload::include_kernels!("<name>")` embeds), tells cargo what to watch, and returns
    /// the container's path.
    pub fn compile(&self, name: &str) -> Result<PathBuf, Error> {
        let out = offload_core::env::os("OUT_DIR").ok_or_else(|| {
            Error("OUT_DIR is not set: Build::compile runs in a build script (use compile_to elsewhere)".into())
        })?;
        println!("cargo:rerun-if-env-changed=OFFLOAD_KERNEL_CC");
        for f in &self.files {
            println!("cargo:rerun-if-changed={}", f.display());
        }
        let path = self.compile_to(Path::new(&out), name)?;
        if let Ok(dir) = self.header_dir() {
            println!(
                "cargo:rerun-if-changed={}",
                dir.join("offload_kernel.h").display()
            );
        }
        Ok(path)
    }

    /// Compiles into `<dir>/<name>.offload` (and one file per target beside it) and returns
    /// the container's path.
    pub fn compile_to(&self, dir: &Path, name: &str) -> Result<PathBuf, Error> {
        if self.files.is_empty() {
            return Err(Error(format!(
                "kernels '{name}': no source file (Build::file)"
            )));
        }
        if name.is_empty() || name.contains(['/', '\0']) {
            return Err(Error(format!("'{name}' is not a file name")));
        }
        for f in &self.files {
            if !f.is_file() {
                return Err(Error(format!(
                    "kernel source {} does not exist",
                    f.display()
                )));
            }
        }
        let header = self.header_dir()?;
        let cc = self.compiler_to_use()?;
        std::fs::create_dir_all(dir)
            .map_err(|e| Error(format!("cannot create {}: {e}", dir.display())))?;
        let targets = if self.targets.is_empty() {
            vec![Target::Host]
        } else {
            self.targets.clone()
        };
        let mut images = Vec::new();
        for t in &targets {
            let out = dir.join(t.file_name(name));
            let mut cmd = Command::new(&cc);
            cmd.arg(self.opt.as_deref().unwrap_or("-O2"))
                .arg("-ffp-contract=off")
                .arg("-I")
                .arg(&header);
            for i in &self.includes {
                cmd.arg("-I").arg(i);
            }
            cmd.args(&self.flags);
            for (k, v) in &self.defines {
                cmd.arg(match v {
                    Some(v) => format!("-D{k}={v}"),
                    None => format!("-D{k}"),
                });
            }
            match t {
                Target::Host => {
                    cmd.args(["-fPIC", "-shared"]);
                }
                Target::HostBitcode => {
                    cmd.args(["-fPIC", "-emit-llvm", "-c"]);
                }
                Target::Nvptx(sm) => {
                    cmd.args([
                        "--target=nvptx64-nvidia-cuda",
                        &format!("-march={sm}"),
                        "-S",
                    ]);
                }
                Target::Amdgcn(gfx) => {
                    cmd.args([
                        "--target=amdgcn-amd-amdhsa",
                        &format!("-mcpu={gfx}"),
                        "-nogpulib",
                    ]);
                }
            }
            if self.files.len() > 1 && matches!(t, Target::HostBitcode | Target::Nvptx(_)) {
                return Err(Error(format!(
                    "kernels '{name}' for {t}: one source file per container (got {}); \
                     #include the others into one",
                    self.files.len()
                )));
            }
            cmd.args(&self.files).arg("-o").arg(&out);
            let shown = format!("{cmd:?}");
            let result = cmd
                .output()
                .map_err(|e| Error(format!("cannot run {cc} for {t}: {e}")))?;
            if !result.status.success() {
                return Err(Error(format!(
                    "compiling kernels '{name}' for {t} failed: {shown}\n{}",
                    String::from_utf8_lossy(&result.stderr).trim_end()
                )));
            }
            let bytes = std::fs::read(&out)
                .map_err(|e| Error(format!("cannot read {}: {e}", out.display())))?;
            images.push((t.clone(), bytes));
        }
        let triples: Vec<String> = images.iter().map(|(t, _)| t.triple()).collect();
        let packed = offload_binary(
            &images
                .iter()
                .zip(&triples)
                .map(|((t, bytes), triple)| PackImage {
                    bytes,
                    triple,
                    arch: t.arch(),
                })
                .collect::<Vec<_>>(),
        );
        let path = dir.join(format!("{name}.offload"));
        std::fs::write(&path, packed)
            .map_err(|e| Error(format!("cannot write {}: {e}", path.display())))?;
        Ok(path)
    }

    fn header_dir(&self) -> Result<PathBuf, Error> {
        if let Some(d) = offload_core::env::os("DEP_OFFLOAD_INCLUDE") {
            return Ok(PathBuf::from(d));
        }
        self.includes
            .iter()
            .find(|d| d.join("offload_kernel.h").is_file())
            .cloned()
            .ok_or_else(|| {
                Error(
                    "the kernel header's directory is unknown: DEP_OFFLOAD_INCLUDE is not set \
                     (cargo sets it for build scripts of crates that depend on `offload`; add \
                     it to [dependencies]) and no Build::include directory holds \
                     offload_kernel.h"
                        .into(),
                )
            })
    }

    /// The compiler [`Build::compile`] runs: the first of the candidates that answers
    /// `--version` (see [`Build::compiler`]).
    pub fn compiler_to_use(&self) -> Result<String, Error> {
        let host_only = self.targets.iter().all(|t| *t == Target::Host);
        let from_env = offload_core::env::raw(&["OFFLOAD_KERNEL_CC"])
            .map_err(|e| Error(e.message().to_string()))?
            .map(|(_, cc)| cc);
        let candidates: Vec<String> = match (&self.compiler, from_env) {
            (Some(cc), _) => vec![cc.clone()],
            (None, Some(cc)) => vec![cc],
            _ if host_only => vec!["clang-19".into(), "clang".into(), "cc".into()],
            _ => vec!["clang-19".into(), "clang".into()],
        };
        let mut tried = Vec::new();
        for cc in &candidates {
            match Command::new(cc).arg("--version").output() {
                Ok(o) if o.status.success() => return Ok(cc.clone()),
                Ok(o) => tried.push(format!("{cc}: exit status {}", o.status)),
                Err(e) => tried.push(format!("{cc}: {e}")),
            }
        }
        Err(Error(format!(
            "no C compiler for the kernels (set OFFLOAD_KERNEL_CC, or install clang-19): tried {}",
            tried.join("; ")
        )))
    }
}
