//! A trial load in a separate process. glibc's dynamic loader trusts what it reads, and an
//! image's initialisers run inside `dlopen`: an image damaged in a way the structural checks
//! (`offload_core::image::elf_dyn`) cannot see, say in the code its initialisers run, would crash or
//! hang the process that loads it. So the image is first loaded by `offload-dlopen-probe` (next
//! to this plugin, or next to the executable), from the same sealed memory file; only if that
//! process loads it and exits normally is it loaded here.

use offload_core::{Error, Result};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The probe's file name.
pub const PROBE: &str = "offload-dlopen-probe";
/// How long a trial load may take (initialisers included).
const TIMEOUT: Duration = Duration::from_secs(20);

/// Where the probe is: next to this plugin library, else next to the executable.
pub fn probe_path() -> Option<&'static PathBuf> {
    static PATH: OnceLock<Option<PathBuf>> = OnceLock::new();
    PATH.get_or_init(|| {
        let mut dirs: Vec<PathBuf> = offload_core::fs::this_library_dir().into_iter().collect();
        dirs.extend(offload_core::fs::exe_dir());
        dirs.into_iter()
            .map(|d| d.join(PROBE))
            .find(|p| p.is_file())
    })
    .as_ref()
}

/// The files of the libraries loaded in this process that define `imports` (the image's
/// undefined symbols), in the order first needed: the probe loads them before the image, so
/// that the image finds there what it will find here (libomp, libstdc++'s
/// `__gxx_personality_v0`). Symbols nothing here defines, and those of the executable itself,
/// give nothing: the probe's own load then says what is missing.
pub fn providers(imports: &[String]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let exe = std::env::current_exe().ok();
    for name in imports {
        let Ok(c) = std::ffi::CString::new(name.as_str()) else {
            continue;
        };
        // SAFETY: a valid C string; RTLD_DEFAULT searches the global scope without loading.
        let addr = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c.as_ptr()) };
        if addr.is_null() {
            continue;
        }
        let Some(file) = offload_core::fs::loaded_file_of(addr as usize) else {
            continue;
        };
        let path = PathBuf::from(std::ffi::OsStr::from_bytes(file.to_bytes()));
        if path.as_os_str().is_empty()
            || !path.is_absolute()
            || exe.as_deref() == Some(path.as_path())
            || out.contains(&path)
        {
            continue;
        }
        out.push(path);
    }
    out
}

/// Loads the image open on `fd` in the probe; `Ok` if it loaded there. `preload`: libraries
/// the probe loads first ([`providers`]).
pub fn trial_load(fd: BorrowedFd<'_>, preload: &[PathBuf]) -> Result<()> {
    let Some(probe) = probe_path() else {
        // Without the probe the image is loaded directly (the plugin's properties say so).
        return Ok(());
    };
    let raw = fd.as_raw_fd();
    let mut cmd = Command::new(probe);
    cmd.arg(raw.to_string())
        .args(preload)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: runs in the child between fork and exec; fcntl and prctl are async-signal-safe.
    // The image's descriptor (close-on-exec here) stays open in the probe, which is told its
    // number.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(raw, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Ends with the thread that waits for it (and so with the process).
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::System(format!("cannot start '{}': {e}", probe.display())))?;
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if started.elapsed() > TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::InvalidImage(format!(
                    "loading the image (its initialisers included) did not finish within {} s in a trial load; refused",
                    TIMEOUT.as_secs()
                )));
            }
            Ok(None) => std::thread::sleep(Duration::from_micros(200)),
            Err(e) => return Err(Error::System(format!("waiting for '{PROBE}': {e}"))),
        }
    };
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read;
        let _ = (&mut e).take(4096).read_to_string(&mut stderr);
    }
    let said = stderr.trim();
    match (status.code(), status.signal()) {
        (Some(0), _) => Ok(()),
        (Some(2), _) => Err(Error::InvalidImage(format!(
            "the dynamic loader rejected the image: {said}"
        ))),
        (_, Some(sig)) => Err(Error::InvalidImage(format!(
            "the image crashes the dynamic loader or its own initialisers: a trial load in a separate process died of signal {sig} ({}); refused",
            signal_name(sig)
        ))),
        (Some(code), _) => Err(Error::InvalidImage(format!(
            "a trial load of the image ended with status {code}{}; refused",
            if said.is_empty() {
                String::new()
            } else {
                format!(": {said}")
            }
        ))),
        (None, None) => Err(Error::System(format!("'{PROBE}' ended without a status"))),
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGBUS => "SIGBUS",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        libc::SIGABRT => "SIGABRT",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGKILL => "SIGKILL",
        _ => "a signal",
    }
}
