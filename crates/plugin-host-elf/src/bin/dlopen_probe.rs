//! `offload-dlopen-probe FD [LIBRARY...]`: loads the LIBRARYs (the host plugin passes those of
//! its process that define what the image imports; one that fails to load is passed over),
//! then the shared object open on file descriptor FD with `dlopen`, as the host plugin is
//! about to, and exits 0 if that worked, 2 with the loader's message on
//! standard error if it refused, or dies of whatever signal the image's loading raises. The
//! host plugin runs it before loading an image into its own process (see the plugin's
//! `probe` module).

use std::ffi::CStr;
use std::process::ExitCode;

fn main() -> ExitCode {
    let Some(fd) = std::env::args().nth(1).and_then(|a| a.parse::<u32>().ok()) else {
        eprintln!("usage: offload-dlopen-probe FD (the host plugin runs this)");
        return ExitCode::from(3);
    };
    for lib in std::env::args_os().skip(2) {
        use std::os::unix::ffi::OsStrExt;
        let Ok(c) = std::ffi::CString::new(lib.as_bytes()) else {
            continue;
        };
        // SAFETY: a valid C string; these libraries are already loaded in the plugin's process.
        unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_GLOBAL) };
    }
    let path = std::ffi::CString::new(format!("/proc/self/fd/{fd}")).expect("no NUL");
    // Functions are bound lazily here: an image may take functions from libraries the plugin's
    // process has loaded and this one has not (an OpenMP image JIT-compiled from bitcode calls
    // the program's libomp). The probe checks that the image loads and its initialisers finish;
    // the plugin's own load (RTLD_NOW) then reports any function that is really missing.
    // SAFETY: a valid C string; loading the image (and running its initialisers) is the point.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
    if handle.is_null() {
        // SAFETY: dlerror returns null or a NUL-terminated string.
        let e = unsafe { libc::dlerror() };
        if !e.is_null() {
            // SAFETY: non-null, NUL-terminated.
            eprintln!("{}", unsafe { CStr::from_ptr(e) }.to_string_lossy());
        }
        return ExitCode::from(2);
    }
    ExitCode::SUCCESS
}
