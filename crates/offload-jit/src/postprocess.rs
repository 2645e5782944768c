//! Post-processing of generated code: what turns the code generator's output into what a
//! device loads (see [`PostProcess`]). Runs in the worker. NVIDIA's `ptxas` is run the same
//! way as the linker: PTX in through a memfd, the cubin out on its stdout.
//!
//! Linking uses `ld.lld` without any file: the object goes in through a sealed, anonymous
//! `memfd` that the linker opens as `/proc/self/fd/N`, and the linked image comes back on the
//! linker's stdout (`-o -`). Nothing is written under `/tmp`, so there is no name to predict,
//! no symlink to follow and nothing to clean up after a signal. The linker is found by
//! [`offload_core::jit::locate_lld`] (the rule the JIT client's disk-cache keys use too) and
//! checked once per process.

use offload_core::jit::PostProcess;
use offload_core::{Error, Result};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

pub use offload_core::jit::ENV_LLD;

/// A linker that answered `--version`.
#[derive(Debug, Clone)]
pub struct Linker {
    /// Its path (or name on `PATH`).
    pub path: PathBuf,
    /// The first line of its `--version`.
    pub version: String,
}

/// The first line of `path --version`, if it runs and says it is LLD.
fn probe(path: &std::path::Path) -> Option<Linker> {
    let out = Command::new(path)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let version = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or("")
        .trim()
        .to_string();
    version.contains("LLD").then(|| Linker {
        path: path.to_path_buf(),
        version,
    })
}

/// The linker, found ([`offload_core::jit::locate_lld`]) and checked on first use and
/// remembered for the process.
pub fn linker() -> Result<&'static Linker> {
    static LINKER: OnceLock<Result<Linker>> = OnceLock::new();
    LINKER
        .get_or_init(|| {
            let path = offload_core::jit::locate_lld()?;
            probe(&path).ok_or_else(|| {
                let from = match offload_core::env::raw(&[ENV_LLD]) {
                    Ok(Some((name, value))) => format!("{name}='{value}'"),
                    _ => "the first ld.lld found".to_string(),
                };
                Error::InvalidArgument(format!(
                    "{from} is not valid: '{}' does not answer --version as LLD",
                    path.display()
                ))
            })
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// `ld.lld ARGS -o - /proc/self/fd/N...`, each object in a memfd.
fn lld(objects: &[&[u8]], args: &[String]) -> Result<Vec<u8>> {
    use std::os::unix::process::CommandExt;
    let lld = linker()?;
    let fds = objects
        .iter()
        .map(|o| {
            offload_core::fs::sealed_memfd(c"offload-jit-object", o, "the object for the linker")
        })
        .collect::<Result<Vec<OwnedFd>>>()?;
    let raws: Vec<i32> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    let mut cmd = Command::new(&lld.path);
    cmd.args(args)
        .args(["-o", "-"])
        .args(raws.iter().map(|raw| format!("/proc/self/fd/{raw}")))
        .stdin(Stdio::null());
    // SAFETY: runs in the child before exec: fcntl and prctl are async-signal-safe. The memfds
    // must survive exec (they are the linker's input), and the linker must not outlive the
    // compile thread that waits for it.
    unsafe {
        cmd.pre_exec(move || {
            for &raw in &raws {
                if libc::fcntl(raw, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
            Ok(())
        });
    }
    let out = cmd
        .output()
        .map_err(|e| Error::System(format!("running {}: {e}", lld.path.display())))?;
    drop(fds);
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        // lld repeats an error per reference; the distinct error lines say it all.
        let mut errors: Vec<&str> = Vec::new();
        for line in stderr.lines().filter(|l| l.contains("error:")) {
            if !errors.contains(&line) {
                errors.push(line);
            }
        }
        if errors.is_empty() {
            errors.extend(stderr.lines().filter(|l| !l.trim().is_empty()).take(3));
        }
        let hint = if stderr.contains("cannot be used with -shared") || stderr.contains("-fPIC") {
            " (the input was not compiled as position-independent code: build host bitcode \
             with clang -fPIC -emit-llvm)"
        } else {
            ""
        };
        return Err(Error::CompileFailure(format!(
            "linking the generated object{} with {} failed ({}): {}{hint}",
            if objects.len() > 1 { "s" } else { "" },
            lld.path.display(),
            out.status,
            errors.join("; ")
        )));
    }
    if out.stdout.is_empty() {
        return Err(Error::CompileFailure(format!(
            "{} wrote no output",
            lld.path.display()
        )));
    }
    Ok(out.stdout)
}

/// `ld.lld -shared ARGS`: the loadable image of one object.
fn link(object: &[u8], args: &[&str]) -> Result<Vec<u8>> {
    let mut all = vec!["-shared".to_string()];
    all.extend(args.iter().map(|a| a.to_string()));
    lld(&[object], &all)
}

/// One relocatable object of several (`ld.lld -r`): the parts of a split compile.
pub fn join_objects(objects: &[Vec<u8>]) -> Result<Vec<u8>> {
    let objects: Vec<&[u8]> = objects.iter().map(Vec::as_slice).collect();
    lld(&objects, &["-r".to_string()])
}

/// `ptxas -arch=ARCH -O<opt> -o /dev/stdout /proc/self/fd/N`, with the PTX in a memfd.
fn ptxas(path: &str, arch: &str, opt: u8, ptx: &[u8]) -> Result<Vec<u8>> {
    use std::os::unix::process::CommandExt;
    let fd = offload_core::fs::sealed_memfd(c"offload-jit-ptx", ptx, "the PTX for ptxas")?;
    let raw = fd.as_raw_fd();
    let mut cmd = Command::new(path);
    cmd.arg(format!("-arch={arch}"))
        .arg(format!("-O{opt}"))
        .args(["-o", "/dev/stdout"])
        .arg(format!("/proc/self/fd/{raw}"))
        .stdin(Stdio::null());
    // SAFETY: as for the linker: fcntl and prctl in the child before exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(raw, libc::F_SETFD, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
            Ok(())
        });
    }
    let out = cmd
        .output()
        .map_err(|e| Error::System(format!("running ptxas '{path}': {e}")))?;
    drop(fd);
    if !out.status.success() || out.stdout.is_empty() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = stderr
            .lines()
            .filter(|l| !l.trim().is_empty())
            .take(6)
            .collect();
        return Err(Error::CompileFailure(format!(
            "assembling the PTX with '{path}' -arch={arch} -O{opt} failed ({}): {}",
            out.status,
            if lines.is_empty() {
                "no output".to_string()
            } else {
                lines.join("; ")
            }
        )));
    }
    Ok(out.stdout)
}

/// Runs `post` on the generated code; `opt` is the JIT's optimisation level.
pub fn run(post: &PostProcess, generated: Vec<u8>, opt: u8) -> Result<Vec<u8>> {
    match post {
        PostProcess::Ptxas { path, arch, .. } => ptxas(path, arch, opt, &generated),
        PostProcess::Unchanged => Ok(generated),
        PostProcess::LinkHostSharedObject => link(&generated, &[]),
        PostProcess::LinkAmdgpuCodeObject { gfx } => link(
            &generated,
            &["--no-undefined", &format!("-plugin-opt=mcpu={gfx}")],
        )
        .map_err(|e| match e {
            // LLVM 19's AMD OpenMP device runtime prints through LLVM's GPU C library, whose
            // calls an RPC server on the host answers.
            Error::CompileFailure(m) if m.contains("undefined symbol: rpc_") => {
                Error::CompileFailure(format!(
                    "{m} (printf and other C library calls in AMD GPU code go through LLVM's \
                     GPU C library and an RPC server on the host, which offload does not \
                     provide: remove the call from the target region)"
                ))
            }
            e => e,
        }),
    }
}
