//! The JIT worker process, seen from the client: started on the first compile, reused by every
//! later one, and replaced when it dies.
//!
//! - **Channels.** Requests go down a UNIX socket pair (the worker's stdin), written with
//!   `MSG_NOSIGNAL` so a dead worker is an error here, never a `SIGPIPE` in the caller's
//!   process. Results come back as frames on the worker's stdout, read by one reader thread that
//!   hands each to the thread waiting for it (compiles run in parallel inside the worker). The
//!   worker's stderr is kept as a tail of its last lines, for error messages. A pipe on the
//!   worker's fd 3 carries its crash notes: the worker's fatal-signal and `exit` handlers write
//!   which request the dying thread was compiling.
//! - **Lifetime.** The worker is spawned from a thread that lives as long as the supervisor,
//!   with `PR_SET_PDEATHSIG`, and it exits when its stdin closes: it never outlives the client
//!   (no orphans), and the reader thread reaps it (no zombies).
//! - **Death.** When the worker dies, every compile in flight gets the death. The one it was
//!   compiling (from its crash note, or the one whose time limit killed it) gets an error that
//!   says what died, on which image and target, the signal and LLVM's last words; the others
//!   are retried once on a fresh worker. A death that names no culprit (killed from outside)
//!   retries everyone once.
//! - **Limits.** The resource limits of [`crate::limits`] (address space, CPU time, file size,
//!   open files) are resolved against this process's own right before the worker starts and
//!   set in the child before `exec`; a compile that hits one gets an error naming the limit
//!   and where it came from. The time limit is kept by each waiting thread, which kills the
//!   worker when its compile overruns.

use crate::config::Limit;
use crate::limits::{self, Applied, Resource, WorkerLimits};
use offload_core::jit::protocol::{self, Hello, WorkerOutput};
use offload_core::text::human_bytes;
use offload_core::{Error, Result};
use std::collections::{HashMap, VecDeque};
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Child, ChildStderr, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::time::{Duration, Instant};

/// Lines of the worker's stderr kept for error messages.
const TAIL_LINES: usize = 40;
/// Longest stderr line kept.
const TAIL_LINE_CHARS: usize = 600;
/// How long a starting worker may take to say hello.
const START_TIMEOUT: Duration = Duration::from_secs(60);

use offload_core::sync::lock;

/// What the supervisor needs to start and judge workers.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    /// The worker executable.
    pub path: PathBuf,
    /// The resource limits asked for.
    pub limits: WorkerLimits,
    /// Per-compile time limit.
    pub timeout: Option<Limit<Duration>>,
    /// The LLVM version the client's keys name; a worker reporting another is refused.
    pub llvm_version: String,
    /// The engine version the client expects.
    pub engine_version: String,
}

/// What one compile on the worker came to.
#[derive(Debug)]
pub enum WorkerFailure {
    /// The compile itself failed (bad input, LLVM error): an ordinary error.
    Compile(Error),
    /// The worker died on this compile (or could not run it): the key is remembered as failed
    /// when `remember` is set.
    Died {
        /// The error for the caller.
        error: Error,
        /// Whether the key should be remembered as failed.
        remember: bool,
    },
}

/// Counters of the worker's life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerStats {
    /// Workers started.
    pub starts: u64,
    /// Workers that died (crashed, were killed, or hit a limit).
    pub deaths: u64,
    /// Compiles killed by the time limit.
    pub timeouts: u64,
    /// Compiles retried on a fresh worker after another compile killed theirs.
    pub retries: u64,
    /// Compile requests written in full to a worker (retries included): from then on the
    /// worker has the request, whether or not it has read it yet.
    pub sent: u64,
}

/// Why a worker died, as far as the client can tell.
#[derive(Debug, Clone)]
enum Cause {
    /// The worker's crash or exit handler named the request.
    Crash {
        request: u64,
        how: String,
        signal: Option<i32>,
    },
    /// A waiting thread killed it: its compile overran the time limit.
    Timeout { request: u64 },
    /// Killed because it broke the protocol.
    Protocol(String),
    /// Nobody knows (killed from outside, or died with no note).
    Unknown,
}

#[derive(Debug, Clone)]
struct Death {
    pid: u32,
    status: String,
    /// The signal in the exit status.
    signal: Option<i32>,
    /// The limits the worker ran under.
    limits: Arc<[Applied]>,
    cause: Cause,
    tail: Vec<String>,
}

impl Death {
    fn culprit(&self) -> Option<u64> {
        match self.cause {
            Cause::Crash { request, .. } | Cause::Timeout { request } => Some(request),
            Cause::Protocol(_) | Cause::Unknown => None,
        }
    }

    /// The last lines the worker printed that say something (LLVM's own words first).
    fn last_words(&self) -> String {
        let lines: Vec<&str> = self
            .tail
            .iter()
            .map(|l| l.trim())
            .filter(|l| !l.is_empty())
            .collect();
        let start = lines
            .iter()
            .rposition(|l| l.starts_with("LLVM ERROR") || l.contains("error"))
            .map(|i| i.saturating_sub(2))
            .unwrap_or(lines.len().saturating_sub(4));
        let picked: Vec<&str> = lines[start..].iter().take(6).copied().collect();
        picked.join(" | ")
    }

    /// The signal that ended the worker, if one did.
    fn signal(&self) -> Option<i32> {
        match self.cause {
            Cause::Crash {
                signal: Some(s), ..
            } => Some(s),
            _ => self.signal,
        }
    }

    fn out_of_memory(&self) -> bool {
        self.tail.iter().any(|l| {
            l.contains("out of memory")
                || l.contains("Allocation failed")
                || l.contains("bad_alloc")
                || l.contains("Cannot allocate memory")
                || l.contains("memory allocation of")
        })
    }
}

#[derive(Debug, Default)]
struct State {
    /// Requests in flight: `None` until the result arrives.
    pending: HashMap<u64, Option<std::result::Result<WorkerOutput, Error>>>,
    hello: Option<std::result::Result<Hello, Error>>,
    dead: Option<Arc<Death>>,
}

/// One running worker process.
#[derive(Debug)]
struct Worker {
    pid: u32,
    socket: Mutex<Option<OwnedFd>>,
    state: Mutex<State>,
    changed: Condvar,
    /// Held while killing and while reaping, so a kill never reaches a reused pid.
    reap: Mutex<bool>,
    /// The resource limits it was started with.
    limits: Arc<[Applied]>,
    kill_reason: Mutex<Option<Cause>>,
}

impl Worker {
    /// Sends `frame` without raising `SIGPIPE` if the worker is gone.
    fn send(&self, frame: &[u8]) -> std::io::Result<()> {
        let guard = lock(&self.socket);
        let Some(fd) = guard.as_ref() else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the worker's input is closed",
            ));
        };
        let mut sent = 0;
        while sent < frame.len() {
            // SAFETY: `fd` is our end of the socket pair; the buffer is live and in bounds.
            let n = unsafe {
                libc::send(
                    fd.as_raw_fd(),
                    frame[sent..].as_ptr().cast(),
                    frame.len() - sent,
                    libc::MSG_NOSIGNAL,
                )
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            sent += n as usize;
        }
        Ok(())
    }

    /// Kills the worker (once), recording why.
    fn kill(&self, reason: Cause) {
        let reaped = lock(&self.reap);
        if *reaped {
            return;
        }
        lock(&self.kill_reason).get_or_insert(reason);
        // SAFETY: the process is not reaped yet (checked under the lock that reaping takes), so
        // the pid is still ours.
        unsafe { libc::kill(self.pid as libc::pid_t, libc::SIGKILL) };
    }
}

/// Starts workers, hands compiles to the live one, and judges deaths.
#[derive(Debug)]
pub struct Supervisor {
    settings: WorkerSettings,
    current: Mutex<Option<Arc<Worker>>>,
    spawner: Mutex<Option<mpsc::Sender<SpawnJob>>>,
    next_id: AtomicU64,
    starts: AtomicU64,
    deaths: Arc<AtomicU64>,
    timeouts: AtomicU64,
    retries: AtomicU64,
    sent: AtomicU64,
}

type SpawnJob = Box<dyn FnOnce() + Send>;

/// What a compile is, for messages: `image 1a2b3c4d5e6f for nvptx64-nvidia-cuda sm_90`.
pub type Describe<'a> = &'a dyn Fn() -> String;

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGABRT => "SIGABRT",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGBUS => "SIGBUS",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => "signal",
    }
}

fn describe_status(status: &std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.signal(), status.code()) {
        (Some(sig), _) => format!("killed by signal {sig} ({})", signal_name(sig)),
        (None, Some(code)) => format!("exited with status {code}"),
        (None, None) => "ended".into(),
    }
}

impl Supervisor {
    /// A supervisor that starts nothing until the first compile.
    pub fn new(settings: WorkerSettings) -> Self {
        Supervisor {
            settings,
            current: Mutex::new(None),
            spawner: Mutex::new(None),
            next_id: AtomicU64::new(1),
            starts: AtomicU64::new(0),
            deaths: Arc::default(),
            timeouts: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            sent: AtomicU64::new(0),
        }
    }

    /// The worker executable.
    pub fn path(&self) -> &std::path::Path {
        &self.settings.path
    }

    /// The live worker's pid, if one is running.
    pub fn pid(&self) -> Option<u32> {
        lock(&self.current)
            .as_ref()
            .filter(|w| lock(&w.state).dead.is_none())
            .map(|w| w.pid)
    }

    /// Counters.
    pub fn stats(&self) -> WorkerStats {
        WorkerStats {
            starts: self.starts.load(Ordering::Relaxed),
            deaths: self.deaths.load(Ordering::Relaxed),
            timeouts: self.timeouts.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
            sent: self.sent.load(Ordering::Relaxed),
        }
    }

    /// Runs `job` on the supervisor's spawner thread (started on first use). Children get
    /// `PR_SET_PDEATHSIG` from the thread that forks them, so that thread must live as long
    /// as the supervisor: it ends when the supervisor (and with it the sender) is dropped.
    fn on_spawner_thread<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T> {
        let mut spawner = lock(&self.spawner);
        if spawner.is_none() {
            let (tx, rx) = mpsc::channel::<SpawnJob>();
            std::thread::Builder::new()
                .name("offload-jit-spawner".into())
                .spawn(move || {
                    for job in rx {
                        job();
                    }
                })
                .map_err(|e| Error::System(format!("cannot start the JIT spawner thread: {e}")))?;
            *spawner = Some(tx);
        }
        let (tx, rx) = mpsc::channel();
        spawner
            .as_ref()
            .expect("set above")
            .send(Box::new(move || {
                let _ = tx.send(job());
            }))
            .map_err(|_| Error::System("the JIT spawner thread has stopped".into()))?;
        drop(spawner);
        rx.recv()
            .map_err(|_| Error::System("the JIT spawner thread has stopped".into()))
    }

    /// The live worker, starting one if there is none (or the last one died).
    fn worker(&self) -> Result<Arc<Worker>> {
        let mut current = lock(&self.current);
        if let Some(w) = current.as_ref()
            && lock(&w.state).dead.is_none()
        {
            return Ok(w.clone());
        }
        let settings = self.settings.clone();
        let deaths = self.deaths.clone();
        let t = std::time::Instant::now();
        let worker = self.on_spawner_thread(move || start(&settings, deaths))??;
        self.starts.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            target: "offload::jit",
            path = %self.settings.path.display(),
            "JIT worker started (pid {}, {:.3} ms)",
            worker.pid,
            t.elapsed().as_secs_f64() * 1e3
        );
        *current = Some(worker.clone());
        Ok(worker)
    }

    /// Compiles one request (a [`protocol::COMPILE`] payload) on the worker.
    pub fn compile(
        &self,
        payload: &[u8],
        what: Describe<'_>,
    ) -> std::result::Result<WorkerOutput, WorkerFailure> {
        let mut retried = false;
        loop {
            let worker = self.worker().map_err(|error| WorkerFailure::Died {
                error,
                remember: false,
            })?;
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            match self.run_on(&worker, id, payload) {
                Ok(Ok(out)) => {
                    crate::report_phases(worker.pid, &out);
                    return Ok(out);
                }
                Ok(Err(e)) => {
                    return Err(WorkerFailure::Compile(annotate_limit(e, &worker.limits)));
                }
                Err(death) => {
                    if death.culprit() == Some(id) {
                        return Err(WorkerFailure::Died {
                            error: self.blame(&death, what),
                            remember: true,
                        });
                    }
                    if retried {
                        return Err(WorkerFailure::Died {
                            error: Error::CompileFailure(format!(
                                "the JIT worker (pid {}) {} while compiling {}, and the fresh \
                                 worker it was retried on died too{}{}",
                                death.pid,
                                death.status,
                                what(),
                                limit_hit(&death)
                                    .map(|l| format!(" ({l})"))
                                    .unwrap_or_default(),
                                match death.last_words() {
                                    w if w.is_empty() => String::new(),
                                    w => format!("; it printed: {w}"),
                                }
                            )),
                            remember: false,
                        });
                    }
                    retried = true;
                    self.retries.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// The error for the compile that killed the worker.
    fn blame(&self, death: &Death, what: Describe<'_>) -> Error {
        let words = death.last_words();
        let said = if words.is_empty() {
            "it printed nothing".to_string()
        } else {
            format!("LLVM said: {words}")
        };
        match &death.cause {
            Cause::Timeout { .. } => {
                let limit = self.settings.timeout.as_ref();
                Error::CompileFailure(format!(
                    "compiling {} took longer than the time limit ({}: {:.3} s); the JIT worker \
                     (pid {}) was killed and will be replaced",
                    what(),
                    limit.map_or("?", |l| l.source.as_str()),
                    limit.map_or(0.0, |l| l.value.as_secs_f64()),
                    death.pid
                ))
            }
            Cause::Crash { how, .. } if death.out_of_memory() => {
                let limit = match limits::find(&death.limits, Resource::AddressSpace) {
                    Some(Applied {
                        value: Some(v),
                        source,
                        ..
                    }) => format!(
                        "the memory limit ({source}: {} of address space)",
                        human_bytes(*v)
                    ),
                    _ => format!(
                        "the machine's memory (no address-space limit; {} sets one)",
                        Resource::AddressSpace.variable()
                    ),
                };
                Error::CompileFailure(format!(
                    "compiling {} ran out of memory under {limit}: the JIT worker (pid {}) {how}; {said}",
                    what(),
                    death.pid
                ))
            }
            Cause::Crash { how, .. } if limit_hit(death).is_some() => {
                Error::CompileFailure(format!(
                    "compiling {} hit {}: the JIT worker (pid {}) {how} and will be replaced; {said}",
                    what(),
                    limit_hit(death).expect("checked"),
                    death.pid
                ))
            }
            Cause::Crash { how, .. } => Error::CompileFailure(format!(
                "the JIT worker (pid {}) {how} while compiling {}; {said}",
                death.pid,
                what()
            )),
            Cause::Protocol(m) => Error::CompileFailure(m.clone()),
            Cause::Unknown => Error::CompileFailure(format!(
                "the JIT worker (pid {}) {} while compiling {}{}; {said}",
                death.pid,
                death.status,
                what(),
                limit_hit(death)
                    .map(|l| format!(" ({l})"))
                    .unwrap_or_default(),
            )),
        }
    }

    /// One attempt: `Ok` with the worker's answer, `Err` with its death.
    fn run_on(
        &self,
        worker: &Arc<Worker>,
        id: u64,
        payload: &[u8],
    ) -> std::result::Result<std::result::Result<WorkerOutput, Error>, Arc<Death>> {
        {
            let mut st = lock(&worker.state);
            if let Some(d) = &st.dead {
                return Err(d.clone());
            }
            st.pending.insert(id, None);
        }
        let sent_at = Instant::now();
        // A failed send: the worker is dying, and its death is published by the reader thread.
        if worker
            .send(&protocol::frame(id, protocol::COMPILE, payload))
            .is_ok()
        {
            self.sent.fetch_add(1, Ordering::Relaxed);
        }
        let deadline = self.settings.timeout.as_ref().map(|t| sent_at + t.value);
        let mut st = lock(&worker.state);
        loop {
            if let Some(Some(_)) = st.pending.get(&id) {
                let reply = st.pending.remove(&id).flatten().expect("checked above");
                return Ok(reply);
            }
            if let Some(d) = &st.dead {
                let d = d.clone();
                st.pending.remove(&id);
                return Err(d);
            }
            match deadline {
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        drop(st);
                        self.timeouts.fetch_add(1, Ordering::Relaxed);
                        worker.kill(Cause::Timeout { request: id });
                        st = lock(&worker.state);
                        // Wait for the reader to publish the death (no deadline now).
                        while st.dead.is_none() && !matches!(st.pending.get(&id), Some(Some(_))) {
                            st = offload_core::sync::wait(&worker.changed, st);
                        }
                        continue;
                    }
                    st = offload_core::sync::wait_timeout(&worker.changed, st, deadline - now).0;
                }
                None => st = offload_core::sync::wait(&worker.changed, st),
            }
        }
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        // Closing the worker's input makes it exit; dropping the spawner ends its thread.
        if let Some(w) = lock(&self.current).take() {
            drop(lock(&w.socket).take());
        }
        drop(lock(&self.spawner).take());
    }
}

/// A socket pair `(ours, theirs)`, both close-on-exec.
fn socket_pair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    } != 0
    {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors are fresh and ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A pipe `(read, write)`, both close-on-exec.
fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors are fresh and ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Starts a worker (on the spawner thread) and waits for its hello.
fn start(settings: &WorkerSettings, deaths: Arc<AtomicU64>) -> Result<Arc<Worker>> {
    use std::os::unix::process::CommandExt;
    let shown = settings.path.display().to_string();
    let (ours, theirs) = socket_pair()
        .map_err(|e| Error::System(format!("cannot create the JIT worker's channel: {e}")))?;
    let (notes_read, notes_write) = pipe()
        .map_err(|e| Error::System(format!("cannot create the JIT worker's note pipe: {e}")))?;
    let notes_fd = notes_write.as_raw_fd();
    let parent = std::process::id() as libc::pid_t;
    // Against this process's limits as they are now: the child is never asked to exceed one.
    let applied: Arc<[Applied]> = settings.limits.resolve()?.into();
    let for_child = applied.clone();
    let mut cmd = Command::new(&settings.path);
    cmd.stdin(Stdio::from(theirs))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: the closure runs in the child between fork and exec and only makes
    // async-signal-safe calls (dup2, fcntl, prctl, getppid, getrlimit, setrlimit, _exit); the
    // limits were resolved (and allocated) before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if notes_fd == 3 {
                if libc::fcntl(3, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(notes_fd, 3) != 3 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before the death signal was armed.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            // (This is the child, between fork and exec, as apply_in_child requires.)
            limits::apply_in_child(&for_child)
        });
    }
    let mut child = cmd.spawn().map_err(|e| {
        // EPERM from the child's setrlimit: a limit changed between resolving and forking.
        let limits_note = if e.raw_os_error() == Some(libc::EPERM) {
            format!(
                " (its limits: {})",
                applied
                    .iter()
                    .map(Applied::describe)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        } else {
            String::new()
        };
        Error::System(format!(
            "cannot start the JIT worker '{shown}': {e}{limits_note}"
        ))
    })?;
    drop(notes_write);
    let stdout = child.stdout.take().expect("piped");
    let stderr = child.stderr.take().expect("piped");
    let worker = Arc::new(Worker {
        pid: child.id(),
        socket: Mutex::new(Some(ours)),
        state: Mutex::new(State::default()),
        changed: Condvar::new(),
        reap: Mutex::new(false),
        kill_reason: Mutex::new(None),
        limits: applied,
    });
    let tail: Arc<Mutex<VecDeque<String>>> = Arc::default();
    let stderr_thread = {
        let tail = tail.clone();
        std::thread::Builder::new()
            .name("offload-jit-stderr".into())
            .spawn(move || collect_stderr(stderr, &tail))
            .map_err(|e| Error::System(format!("cannot start a JIT reader thread: {e}")))?
    };
    {
        let worker = worker.clone();
        let expected = (
            settings.llvm_version.clone(),
            settings.engine_version.clone(),
        );
        std::thread::Builder::new()
            .name("offload-jit-reader".into())
            .spawn(move || {
                let process = Process {
                    stdout,
                    child,
                    notes: notes_read,
                    stderr_thread,
                    tail,
                };
                read_results(worker, process, expected, &deaths)
            })
            .map_err(|e| Error::System(format!("cannot start a JIT reader thread: {e}")))?;
    }
    // Wait for the hello (or the death) before handing the worker out.
    let deadline = Instant::now() + START_TIMEOUT;
    let mut st = lock(&worker.state);
    loop {
        if let Some(hello) = &st.hello {
            return match hello {
                Ok(_) => {
                    drop(st);
                    Ok(worker)
                }
                Err(e) => {
                    let e = e.clone();
                    drop(st);
                    worker.kill(Cause::Protocol(e.to_string()));
                    Err(e)
                }
            };
        }
        if let Some(d) = &st.dead {
            let limit_hint = match limits::find(&d.limits, Resource::AddressSpace) {
                Some(Applied {
                    value: Some(v),
                    source,
                    ..
                }) if d
                    .tail
                    .iter()
                    .any(|t| t.contains("map") || t.contains("memory")) =>
                {
                    format!(
                        " (the memory limit {source} = {} may be too small to load LLVM)",
                        human_bytes(*v)
                    )
                }
                _ => limit_hit(d).map(|l| format!(" ({l})")).unwrap_or_default(),
            };
            return Err(Error::System(format!(
                "the JIT worker '{shown}' {} before it was ready{limit_hint}; it printed: {}",
                d.status,
                match d.last_words() {
                    w if w.is_empty() => "nothing".to_string(),
                    w => w,
                }
            )));
        }
        let now = Instant::now();
        if now >= deadline {
            drop(st);
            worker.kill(Cause::Protocol("the worker did not start in time".into()));
            return Err(Error::System(format!(
                "the JIT worker '{shown}' did not say hello within {} s; it was killed",
                START_TIMEOUT.as_secs()
            )));
        }
        st = offload_core::sync::wait_timeout(&worker.changed, st, deadline - now).0;
    }
}

fn collect_stderr(stderr: ChildStderr, tail: &Mutex<VecDeque<String>>) {
    use std::io::BufRead;
    let mut reader = std::io::BufReader::new(stderr);
    let mut line = Vec::new();
    loop {
        line.clear();
        // Bounded: a line longer than this is cut, the rest read as further lines.
        match (&mut reader).take(64 * 1024).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let text = String::from_utf8_lossy(&line);
                let text: String = text.trim_end().chars().take(TAIL_LINE_CHARS).collect();
                let mut t = lock(tail);
                if t.len() == TAIL_LINES {
                    t.pop_front();
                }
                t.push_back(text);
            }
        }
    }
}

/// What the reader thread owns of a worker process.
struct Process {
    stdout: ChildStdout,
    child: Child,
    notes: OwnedFd,
    stderr_thread: std::thread::JoinHandle<()>,
    tail: Arc<Mutex<VecDeque<String>>>,
}

/// The reader thread: results to their waiters, then the death.
fn read_results(
    worker: Arc<Worker>,
    process: Process,
    expected: (String, String),
    deaths: &AtomicU64,
) {
    let Process {
        mut stdout,
        mut child,
        notes,
        stderr_thread,
        tail,
    } = process;
    let mut protocol_error: Option<String> = None;
    loop {
        match protocol::read_frame(&mut stdout) {
            Ok(Some(frame)) => match frame.kind {
                protocol::HELLO => {
                    let hello = Hello::decode(&frame.payload).and_then(|h| {
                        if h.version != protocol::VERSION {
                            Err(Error::System(format!(
                                "the JIT worker speaks protocol {}, this client {}: it is from \
                                 another build of offload",
                                h.version,
                                protocol::VERSION
                            )))
                        } else if h.llvm != expected.0 || h.engine != expected.1 {
                            Err(Error::System(format!(
                                "the JIT worker was built with LLVM {} and engine {}, this client \
                                 expects LLVM {} and engine {}: it is from another build of offload",
                                h.llvm, h.engine, expected.0, expected.1
                            )))
                        } else {
                            Ok(h)
                        }
                    });
                    lock(&worker.state).hello = Some(hello);
                    worker.changed.notify_all();
                }
                protocol::RESULT => {
                    let reply = match protocol::decode_result(&frame.payload) {
                        Ok(r) => r,
                        Err(e) => {
                            protocol_error =
                                Some(format!("the JIT worker sent a corrupt result: {e}"));
                            break;
                        }
                    };
                    let mut st = lock(&worker.state);
                    if let Some(slot) = st.pending.get_mut(&frame.id) {
                        *slot = Some(reply);
                    }
                    drop(st);
                    worker.changed.notify_all();
                }
                k => {
                    protocol_error =
                        Some(format!("the JIT worker sent a frame of unknown kind {k}"));
                    break;
                }
            },
            Ok(None) => break,
            Err(e) => {
                protocol_error = Some(format!("reading from the JIT worker failed: {e}"));
                break;
            }
        }
    }
    if let Some(m) = &protocol_error {
        worker.kill(Cause::Protocol(m.clone()));
    }
    drop(lock(&worker.socket).take());
    let status = {
        let mut reaped = lock(&worker.reap);
        let status = child.wait();
        *reaped = true;
        status
    };
    let _ = stderr_thread.join();
    let mut note_text = String::new();
    let _ = std::fs::File::from(notes).read_to_string(&mut note_text);
    let status_text = match &status {
        Ok(s) => describe_status(s),
        Err(e) => format!("could not be waited for ({e})"),
    };
    let cause = lock(&worker.kill_reason).clone().unwrap_or_else(|| {
        // The first note names the request whose thread died: `crash <id> <signal>` or
        // `exit <id> <status>`.
        note_text
            .lines()
            .find_map(|l| {
                let mut parts = l.split_whitespace();
                let kind = parts.next()?;
                let request: u64 = parts.next()?.parse().ok()?;
                let (how, signal) = match kind {
                    "crash" => {
                        let sig: i32 = parts.next()?.parse().ok()?;
                        (
                            format!("was killed by signal {sig} ({})", signal_name(sig)),
                            Some(sig),
                        )
                    }
                    "exit" => (format!("exited ({status_text}) from inside LLVM"), None),
                    _ => return None,
                };
                Some(Cause::Crash {
                    request,
                    how,
                    signal,
                })
            })
            .unwrap_or(Cause::Unknown)
    });
    let clean_exit = matches!(&status, Ok(s) if s.success()) && protocol_error.is_none();
    if !clean_exit {
        deaths.fetch_add(1, Ordering::Relaxed);
        tracing::info!(target: "offload::jit", "JIT worker (pid {}) died: {status_text}", worker.pid);
    }
    let death = Death {
        pid: worker.pid,
        status: status_text,
        signal: {
            use std::os::unix::process::ExitStatusExt;
            status.as_ref().ok().and_then(|s| s.signal())
        },
        limits: worker.limits.clone(),
        cause,
        tail: lock(&tail).iter().cloned().collect(),
    };
    let mut st = lock(&worker.state);
    st.dead = Some(Arc::new(death));
    drop(st);
    worker.changed.notify_all();
}

/// The resource limit a death shows the worker hit, described with where it came from:
/// `SIGXCPU` is the CPU-time limit, `SIGXFSZ` the file-size limit, "Too many open files" in
/// its last words the open-files limit. (Running out of address space shows as an allocation
/// failure, told apart by [`Death::out_of_memory`].)
fn limit_hit(death: &Death) -> Option<String> {
    let resource = match death.signal() {
        Some(libc::SIGXCPU) => Resource::CpuTime,
        Some(libc::SIGXFSZ) => Resource::FileSize,
        _ if death.tail.iter().any(|l| l.contains("Too many open files")) => Resource::OpenFiles,
        _ => return None,
    };
    Some(limit_text(&death.limits, resource))
}

/// `the JIT worker's CPU-time limit (100 s, from OFFLOAD_JIT_CPU_LIMIT=100; ...)`.
fn limit_text(limits: &[Applied], resource: Resource) -> String {
    let over_life = if resource == Resource::CpuTime {
        ", counted over the worker's life"
    } else {
        ""
    };
    match limits::find(limits, resource) {
        Some(a) => format!(
            "the JIT worker's {} limit ({}, {}{over_life}{})",
            resource.noun(),
            resource.show(a.value),
            a.source,
            if a.source.contains(resource.variable()) {
                String::new()
            } else {
                format!("; {} sets it", resource.variable())
            }
        ),
        None => format!("the JIT worker's {} limit", resource.noun()),
    }
}

/// A compile error whose text shows a resource limit (a linker killed by `SIGXFSZ`, a file
/// that could not be opened for lack of descriptors) gets the limit that applied added.
pub(crate) fn annotate_limit(error: Error, limits: &[Applied]) -> Error {
    let text = error.message();
    let resource = if text.contains("Too many open files") || text.contains("os error 24") {
        Resource::OpenFiles
    } else if text.contains("File too large")
        || text.contains("os error 27")
        || text.contains("SIGXFSZ")
        || text.contains("signal: 25")
    {
        Resource::FileSize
    } else {
        return error;
    };
    Error::from_parts(
        error.kind() as u32,
        error.native_code(),
        format!("{text} (under {})", limit_text(limits, resource)),
    )
}
