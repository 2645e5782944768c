//! The worker process's side of the JIT protocol (`offload_core::jit::protocol`), and the
//! request handler the in-process entry point shares with it.
//!
//! The worker reads compile requests from stdin and runs each on a thread of its own (compiles
//! of different keys run in parallel), writing each result to stdout as one frame. It exits when
//! stdin closes (its parent is gone or done). When a thread dies inside LLVM (a fatal signal,
//! or LLVM calling `exit`), a handler writes `crash <request> <signal>` or `exit <request>` to
//! fd 3 before the process dies, so the client can tell which compile killed it. SIGINT is
//! ignored: a Ctrl-C is the parent's to handle.

use crate::compile_request;
use offload_core::jit::protocol::{self, Hello, WorkerOutput};
use std::cell::Cell;
use std::io::Write;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Test aid: when set to N, each compile waits (up to 20 s) until N compiles have started, so
/// a test can prove that compiles run at the same time without timing them.
pub const ENV_RENDEZVOUS: &str = "OFFLOAD_JIT_WORKER_RENDEZVOUS";
/// Stack of a compile thread (LLVM recurses deeply on large functions).
pub(crate) const COMPILE_STACK: usize = 16 << 20;
/// The descriptor crash notes go to.
const NOTES_FD: i32 = 3;

thread_local! {
    /// The request the current thread compiles (0: none). Read from signal handlers: a const
    /// thread-local of a plain integer is a direct TLS access, no allocation, no lock.
    static CURRENT: Cell<u64> = const { Cell::new(0) };
}

static RUNNING: AtomicU32 = AtomicU32::new(0);
static PEAK: AtomicU32 = AtomicU32::new(0);

/// Formats `prefix <id>[ <n>]\n` into `buf` without allocating; returns the length.
fn format_note(buf: &mut [u8; 64], prefix: &[u8], id: u64, extra: Option<u64>) -> usize {
    fn push_num(buf: &mut [u8; 64], at: &mut usize, mut v: u64) {
        let mut digits = [0u8; 20];
        let mut n = 0;
        loop {
            digits[n] = b'0' + (v % 10) as u8;
            n += 1;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        for i in (0..n).rev() {
            buf[*at] = digits[i];
            *at += 1;
        }
    }
    let mut at = 0;
    for &b in prefix {
        buf[at] = b;
        at += 1;
    }
    buf[at] = b' ';
    at += 1;
    push_num(buf, &mut at, id);
    if let Some(x) = extra {
        buf[at] = b' ';
        at += 1;
        push_num(buf, &mut at, x);
    }
    buf[at] = b'\n';
    at + 1
}

extern "C" fn on_fatal_signal(sig: libc::c_int) {
    let id = CURRENT.with(Cell::get);
    let mut buf = [0u8; 64];
    let len = format_note(&mut buf, b"crash", id, Some(sig as u64));
    // SAFETY: write(2), signal(2) and raise(3) are async-signal-safe; the buffer is local.
    unsafe {
        libc::write(NOTES_FD, buf.as_ptr().cast(), len);
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

extern "C" fn on_exit() {
    let id = CURRENT.with(Cell::get);
    if id == 0 {
        return;
    }
    let mut buf = [0u8; 64];
    let len = format_note(&mut buf, b"exit", id, None);
    // SAFETY: a plain write of a local buffer.
    unsafe { libc::write(NOTES_FD, buf.as_ptr().cast(), len) };
}

fn install_handlers() {
    // SAFETY: installs handlers that only do async-signal-safe work; fcntl on fd 3 is harmless
    // if it is not open (the worker then runs without crash notes).
    unsafe {
        // Notes must not leak into the linker processes the worker starts.
        libc::fcntl(NOTES_FD, libc::F_SETFD, libc::FD_CLOEXEC);
        for sig in [
            libc::SIGSEGV,
            libc::SIGBUS,
            libc::SIGABRT,
            libc::SIGILL,
            libc::SIGFPE,
            libc::SIGTRAP,
            libc::SIGSYS,
            // Resource limits (see the client's `limits`): SIGXFSZ goes to the thread that
            // wrote, so its note names the compile; SIGXCPU goes to any thread.
            libc::SIGXFSZ,
            libc::SIGXCPU,
        ] {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_fatal_signal as extern "C" fn(libc::c_int) as usize;
            action.sa_flags = libc::SA_ONSTACK | libc::SA_RESETHAND;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(sig, &action, std::ptr::null_mut());
        }
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::atexit(on_exit);
    }
}

/// Waits until `n` compiles have started (test aid, see [`ENV_RENDEZVOUS`]); an error if that
/// does not happen within 20 s, i.e. if compiles do not run at the same time.
fn rendezvous(n: u32) -> offload_core::Result<()> {
    static STARTED: (Mutex<u32>, Condvar) = (Mutex::new(0), Condvar::new());
    let (m, cv) = &STARTED;
    let mut started = offload_core::sync::lock(m);
    *started += 1;
    cv.notify_all();
    let (started, timeout) = cv
        .wait_timeout_while(started, Duration::from_secs(20), |s| *s < n)
        .unwrap_or_else(|p| p.into_inner());
    if timeout.timed_out() {
        return Err(offload_core::Error::CompileFailure(format!(
            "{ENV_RENDEZVOUS}={n}: only {} compile(s) started within 20 s",
            *started
        )));
    }
    Ok(())
}

/// Handles one [`protocol::COMPILE`] payload and returns the [`protocol::RESULT`] payload.
/// Shared by the worker and the in-process entry point.
pub fn handle(payload: &[u8]) -> Vec<u8> {
    let started = Instant::now();
    let running = RUNNING.fetch_add(1, Ordering::SeqCst) + 1;
    PEAK.fetch_max(running, Ordering::SeqCst);
    let result = protocol::decode_compile(payload).and_then(|request| {
        // A bad value is this compile's error, naming the variable.
        if let Some(n) = offload_core::env::parsed::<u32>(
            &[ENV_RENDEZVOUS],
            |n| *n >= 1,
            "a number of compiles, 1 or more",
        )? {
            rendezvous(n)?;
        }
        crate::phases::begin();
        std::panic::catch_unwind(|| compile_request(&request)).unwrap_or_else(|p| {
            let text = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic payload".into());
            Err(offload_core::Error::CompileFailure(format!(
                "the JIT engine panicked: {text}"
            )))
        })
    });
    let phases = crate::phases::take();
    let result = result.map(|output| WorkerOutput {
        output,
        compile_ns: started.elapsed().as_nanos() as u64,
        concurrency: PEAK.load(Ordering::SeqCst),
        phases,
    });
    RUNNING.fetch_sub(1, Ordering::SeqCst);
    protocol::encode_result(&result)
}

/// The worker's main loop; returns the process exit status.
pub fn worker_main() -> i32 {
    install_handlers();
    crate::compile::initialize_targets();
    let stdout = Arc::new(Mutex::new(std::io::stdout()));
    let hello = Hello {
        version: protocol::VERSION,
        llvm: crate::llvm_version(),
        engine: crate::ENGINE_VERSION.to_string(),
    };
    {
        let mut out = offload_core::sync::lock(&stdout);
        if protocol::write_frame(&mut *out, 0, protocol::HELLO, &hello.encode()).is_err() {
            return 1;
        }
    }
    let mut stdin = std::io::stdin().lock();
    loop {
        let frame = match protocol::read_frame(&mut stdin) {
            Ok(Some(f)) => f,
            // The client is gone or done: stop now, without running LLVM's static destructors
            // under compiles that may still be running.
            Ok(None) => return 0,
            Err(e) => {
                eprintln!("offload-jit-worker: bad request stream: {e}");
                return 2;
            }
        };
        if frame.kind != protocol::COMPILE {
            eprintln!("offload-jit-worker: unexpected frame kind {}", frame.kind);
            return 2;
        }
        let out_for_thread = stdout.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("compile-{}", frame.id))
            .stack_size(COMPILE_STACK)
            .spawn(move || {
                CURRENT.with(|c| c.set(frame.id));
                let result = handle(&frame.payload);
                drop(frame.payload);
                let mut out = offload_core::sync::lock(&out_for_thread);
                let written = protocol::write_frame(&mut *out, frame.id, protocol::RESULT, &result);
                drop(out);
                CURRENT.with(|c| c.set(0));
                if written.is_err() {
                    // The client is gone; nothing left to do.
                    // SAFETY: ends the process without running destructors (see above).
                    unsafe { libc::_exit(0) };
                }
            });
        if let Err(e) = spawned {
            let result = protocol::encode_result(&Err(offload_core::Error::System(format!(
                "the JIT worker cannot start a compile thread: {e}"
            ))));
            let mut out = offload_core::sync::lock(&stdout);
            let _ = protocol::write_frame(&mut *out, frame.id, protocol::RESULT, &result);
            let _ = out.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_are_formatted_without_allocation() {
        let mut buf = [0u8; 64];
        let n = format_note(&mut buf, b"crash", 18446744073709551615, Some(6));
        assert_eq!(&buf[..n], b"crash 18446744073709551615 6\n");
        let n = format_note(&mut buf, b"exit", 0, None);
        assert_eq!(&buf[..n], b"exit 0\n");
    }
}
