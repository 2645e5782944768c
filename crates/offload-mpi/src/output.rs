//! A proxy's standard output, kept for the program: what a kernel or a target region prints
//! on the proxy's node (its `printf`) goes, with the next reply, to the program's standard
//! output ([`crate::wire::Reply::Output`]), so that it comes between the program's own lines
//! in the order it would on a local device, instead of beside them in whatever order `mpirun`
//! merges two processes' output.
//!
//! [`capture`] points file descriptor 1 at a pipe. A thread of its own reads the pipe as it
//! fills (a kernel printing more than a pipe holds never blocks); [`take`], after each
//! request, flushes C's `stdout` and collects the rest. It costs no system call when nothing
//! was printed: C's stream (buffered in a megabyte) says what it holds (`__fpending`, under
//! the stream's lock), and the reading thread says whether the pipe woke it. Bytes written to
//! the descriptor itself (Rust's `println!`) in the last instant before a reply, before the
//! reading thread woke, may come with the next reply instead; so may the end of a request's
//! output through C's `stdout` (or C++'s `std::cout`, which writes through it) that filled the
//! stream's buffer exactly. Everything else comes in order.
//!
//! At the proxy's end ([`release`], an exit handler, also run before the proxy's `_exit`),
//! what no reply carried goes to the proxy's own output, and so does everything printed after
//! (file descriptor 1 is given back). Lost, as a local program's would be: what a proxy that is
//! killed or crashes had not flushed; and what was sent to a program that took no more
//! replies (it ended, or gave the proxy up).

use offload_core::sync::lock;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

/// The most bytes kept for the program. Past it (a region printing faster than replies carry
/// it away) what is kept goes to the proxy's own standard output, where `mpirun` forwards it
/// beside the program's; one reply carries at most this much and a read.
const KEEP: usize = 16 << 20;

/// The size of C's `stdout` buffer in a proxy.
const STREAM_BUFFER: usize = 1 << 20;

struct Captured {
    /// The pipe's read end (non-blocking).
    read: RawFd,
    /// The descriptor 1 the proxy was started with.
    original: RawFd,
    /// What was read and not yet taken.
    kept: Mutex<Vec<u8>>,
    /// Whether the reading thread read anything since the last [`take`].
    seen: AtomicBool,
}

static CAPTURED: OnceLock<Captured> = OnceLock::new();

unsafe extern "C" {
    static stdout: *mut libc::FILE;
    fn __fpending(stream: *mut libc::FILE) -> libc::size_t;
    fn flockfile(stream: *mut libc::FILE);
    fn funlockfile(stream: *mut libc::FILE);
}

/// Points file descriptor 1 at a pipe whose bytes [`take`] returns. Once per process.
pub fn capture() -> std::io::Result<()> {
    if CAPTURED.get().is_some() {
        return Ok(());
    }
    let err = std::io::Error::last_os_error;
    let mut fds = [0 as RawFd; 2];
    // SAFETY: plain system calls on descriptors this function owns; `stdout` is the C
    // library's stream, flushed first so that nothing written before goes to the pipe.
    unsafe {
        libc::fflush(stdout);
        if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return Err(err());
        }
        let original = libc::fcntl(1, libc::F_DUPFD_CLOEXEC, 3);
        if original < 0 || libc::dup2(fds[1], 1) < 0 {
            let e = err();
            libc::close(fds[0]);
            libc::close(fds[1]);
            if original >= 0 {
                libc::close(original);
            }
            return Err(e);
        }
        libc::close(fds[1]);
        // Fully buffered in a megabyte: what one request prints usually stays in the stream
        // until `take` (the pipe then holds nothing to wait for). (ISO C wants setvbuf before
        // any other use of the stream; glibc and musl take it after a flush. If it fails, the
        // stream keeps its buffer and only the fast path gets rarer.)
        let buf: &'static mut [u8] = Box::leak(vec![0u8; STREAM_BUFFER].into_boxed_slice());
        let _ = libc::setvbuf(stdout, buf.as_mut_ptr().cast(), libc::_IOFBF, buf.len());
        let flags = libc::fcntl(fds[0], libc::F_GETFL);
        libc::fcntl(fds[0], libc::F_SETFL, flags | libc::O_NONBLOCK);
        let _ = CAPTURED.set(Captured {
            read: fds[0],
            original,
            kept: Mutex::new(Vec::new()),
            seen: AtomicBool::new(false),
        });
    }
    if let Err(e) = std::thread::Builder::new()
        .name("offload-mpi-output".into())
        .spawn(reader)
    {
        // Nobody would drain the pipe: the descriptor goes back.
        restore();
        return Err(e);
    }
    extern "C" fn at_exit() {
        release();
    }
    // SAFETY: registers a handler that only flushes, reads and writes descriptors.
    unsafe { libc::atexit(at_exit) };
    Ok(())
}

/// Gives file descriptor 1 back (C's `stdout` flushed first into the pipe).
fn restore() {
    if let Some(c) = CAPTURED.get() {
        // SAFETY: descriptors this module owns; the pipe's write end closes with the dup2,
        // which ends the reading thread.
        unsafe {
            libc::fflush(stdout);
            libc::dup2(c.original, 1);
        }
    }
}

/// Reads the pipe as it fills.
fn reader() {
    let Some(c) = CAPTURED.get() else { return };
    loop {
        let mut p = libc::pollfd {
            fd: c.read,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut p, 1, -1) };
        if r < 0 {
            // (EINTR, or no memory for a moment: a reader that gave up would leave printing
            // threads blocked on a full pipe.)
            std::thread::sleep(std::time::Duration::from_millis(1));
            continue;
        }
        if p.revents & libc::POLLIN != 0 {
            // Before the lock: a `take` waiting for it reads the pipe itself.
            c.seen.store(true, Ordering::Release);
        }
        let mut kept = lock(&c.kept);
        if read_available(c.read, &mut kept) {
            // Again under the lock: a `take` since the first store cleared it.
            c.seen.store(true, Ordering::Release);
        } else if p.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
            // The write end is closed: the descriptor was given back.
            return;
        }
        if kept.len() >= KEEP {
            write_all(c.original, &kept);
            kept.clear();
        }
    }
}

/// Appends what the pipe holds now to `kept`, up to [`KEEP`] bytes kept; whether there was
/// anything.
fn read_available(fd: RawFd, kept: &mut Vec<u8>) -> bool {
    let mut any = false;
    let mut buf = [0u8; 64 << 10];
    while kept.len() < KEEP {
        // SAFETY: `buf` is writable for its length.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n > 0 {
            kept.extend_from_slice(&buf[..n as usize]);
            any = true;
            continue;
        }
        if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        break;
    }
    any
}

fn write_all(fd: RawFd, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: `bytes` is readable for its length.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n > 0 {
            bytes = &bytes[n as usize..];
        } else if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
        {
            continue;
        } else {
            return;
        }
    }
}

/// Everything printed since the last call (C's `stdout` flushed), or `None` when nothing was:
/// then without a system call. `None` too when the output is not captured.
pub fn take() -> Option<Vec<u8>> {
    let c = CAPTURED.get()?;
    // SAFETY: `stdout` is the C library's stream; __fpending reads its state under its lock.
    let pending = unsafe {
        flockfile(stdout);
        let n = __fpending(stdout);
        funlockfile(stdout);
        n
    } > 0;
    if !pending && !c.seen.load(Ordering::Acquire) {
        return None;
    }
    // SAFETY: as above; fflush takes the stream's lock.
    unsafe { libc::fflush(stdout) };
    let mut kept = lock(&c.kept);
    read_available(c.read, &mut kept);
    c.seen.store(false, Ordering::Release);
    (!kept.is_empty()).then(|| std::mem::take(&mut *kept))
}

/// At the proxy's end: what no reply carried goes to the proxy's own standard output, and
/// file descriptor 1 goes back to it (what is printed later goes there at once). Run at exit;
/// call it before `_exit`.
pub fn release() {
    let Some(c) = CAPTURED.get() else { return };
    restore();
    let mut kept = lock(&c.kept);
    while read_available(c.read, &mut kept) {
        write_all(c.original, &kept);
        kept.clear();
    }
    write_all(c.original, &kept);
    kept.clear();
}
