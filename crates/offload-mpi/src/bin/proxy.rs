//! `offload-mpi-proxy`: serves its node's devices to rank 0 of an MPI job
//! (`mpirun -n 1 ./app : -n N offload-mpi-proxy`). It says hello (its version and devices) to
//! rank 0, then serves each request until rank 0 sends the shutdown tag (at its exit).

use mpi::datatype::Equivalence;
use mpi::point_to_point::{Destination, MatchedReceiveVec, Source};
use mpi::topology::{Communicator, Process, SimpleCommunicator};
use offload_core::sync::lock;
use offload_mpi::client::{Backoff, ChunkPool, Sending};
use offload_mpi::output;
use offload_mpi::serve::{Data, Served, Server};
use offload_mpi::wire::{Reply, Request};
use offload_mpi::{
    HEARTBEAT, TAG_ALIVE, TAG_DATA, TAG_ECHO_GET, TAG_ECHO_PUT, TAG_HELLO, TAG_REPLY, TAG_REQUEST,
    TAG_SHUTDOWN,
};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

fn main() {
    let Some((universe, _)) = mpi::initialize_with_threading(mpi::Threading::Serialized) else {
        eprintln!("offload-mpi-proxy: MPI could not be initialised (start it under mpirun)");
        std::process::exit(2);
    };
    let world = universe.world();
    let me = world.rank();
    // What the node prints goes to the program with the replies (offload_mpi::output).
    if let Err(e) = output::capture() {
        eprintln!(
            "offload-mpi-proxy (rank {me}): its output is not forwarded to the program (it goes \
             to mpirun beside the program's): {e}"
        );
    }
    if let Err(e) = load_openmp_runtime() {
        eprintln!("offload-mpi-proxy (rank {me}): {e}");
    }
    // The runtime lives as long as the proxy serves its devices. The proxy serves every
    // device of its node but its own remote ones (the `mpi` plugin, if installed here too).
    let runtime = offload::Runtime::from_env();
    let served = match &runtime {
        Ok(rt) => rt
            .devices()
            .into_iter()
            .filter(|d| d.plugin_name() != "mpi")
            .map(|d| {
                let claims = rt
                    .plugin(d.plugin_name())
                    .ok()
                    .and_then(|s| s.image_claims())
                    .unwrap_or_default();
                Served {
                    plugin: d.plugin_name().to_string(),
                    index: d.index(),
                    claims,
                    // SAFETY: the proxy keeps the raw module's promises on the program's
                    // behalf: every address and handle it passes comes from the program,
                    // which keeps them for its own device (offload_mpi::serve), and the
                    // layer below checks each against what it handed out.
                    device: unsafe { offload::raw::device(&d) }.clone(),
                }
            })
            .collect(),
        Err(e) => {
            eprintln!("offload-mpi-proxy (rank {me}): no runtime: {e}");
            Vec::new()
        }
    };
    let kill_at = kill_at(me);
    let timeout = match offload_mpi::timeout_secs() {
        Ok(s) => Duration::from_secs(u64::from(s)),
        Err(e) => {
            eprintln!("offload-mpi-proxy (rank {me}): {e}");
            std::process::exit(2);
        }
    };
    let mut server = Server::new(served);
    let hello = server.hello().unwrap_or_else(|e| Reply::failed(&e));
    let mut hello = hello.encode(0);
    if let Some(v) = claimed_version() {
        hello[4..6].copy_from_slice(&v.to_le_bytes());
    }
    let client = world.process_at_rank(0);
    client.send_with_tag(&hello[..], TAG_HELLO);
    std::thread::spawn(heartbeat);
    let mut echo: Vec<u8> = Vec::new();
    let mut message: Vec<u8> = Vec::new();
    let mut pool = ChunkPool::default();
    let mut backoff = Backoff::default();
    loop {
        let probed = {
            let _mpi = lock(&MPI);
            client.immediate_matched_probe()
        };
        let Some(probed) = probed else {
            backoff.pause();
            continue;
        };
        backoff = Backoff::default();
        let tag = probed.1.tag();
        if tag == TAG_ECHO_PUT {
            // Plain MPI, the benchmark's reference: the bytes into memory reused, an empty
            // answer.
            let _mpi = lock(&MPI);
            let n = probed.1.count(u8::equivalent_datatype()) as usize;
            if echo.len() < n {
                echo.resize(n, 0);
            }
            probed.0.matched_receive_into(&mut echo[..n]);
            client.send_with_tag(&[0u8; 0][..], TAG_ECHO_PUT);
            continue;
        }
        // Busy from here (a large request's receive included) until its replies are out.
        BUSY.store(true, Ordering::Release);
        // Into a buffer kept from one request to the next (a fresh one costs its allocation,
        // and a large one its page faults).
        let n = probed.1.count(u8::equivalent_datatype()) as usize;
        if message.len() < n {
            message.resize(n, 0);
        }
        {
            let _mpi = lock(&MPI);
            probed.0.matched_receive_into(&mut message[..n]);
        }
        let bytes = &message[..n];
        match tag {
            TAG_REQUEST => {}
            // One byte: a rank of the job died, and MPI_Finalize would wait for it.
            TAG_SHUTDOWN if !bytes.is_empty() => {
                let _mpi = lock(&MPI);
                STOPPED.store(true, Ordering::Release);
                std::process::exit(0)
            }
            TAG_SHUTDOWN => break,
            TAG_ECHO_GET => {
                let n = bytes
                    .get(..8)
                    .map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
                    .min(1 << 30) as usize;
                if echo.len() < n {
                    echo.resize(n, 0);
                }
                let _mpi = lock(&MPI);
                client.send_with_tag(&echo[..n], TAG_ECHO_GET);
                BUSY.store(false, Ordering::Release);
                continue;
            }
            // Nothing else is sent to a proxy: a stray message is dropped.
            _ => {
                BUSY.store(false, Ordering::Release);
                continue;
            }
        }
        if let Some(what) = &kill_at
            && Request::decode(bytes).is_ok_and(|(_, r)| r.name() == what)
        {
            // SAFETY: raise has no precondition; SIGKILL ends this process here.
            unsafe { libc::raise(libc::SIGKILL) };
        }
        let mut data = MpiData {
            client: &client,
            timeout,
            pool: &mut pool,
        };
        let mut replies = server.answer(bytes, &mut data);
        if !replies.is_empty()
            && let Some(printed) = output::take()
        {
            // Before the replies: the program prints it before it goes on.
            replies.insert(0, Reply::Output { bytes: printed }.encode(0));
        }
        for reply in replies {
            let n = reply.len();
            // A small reply completes at once (MPI copies it out): tested under the same lock.
            let sent = {
                let _mpi = lock(&MPI);
                Sending::start(&client, reply.into_boxed_slice(), n, TAG_REPLY).test()
            };
            if let Err(sending) = sent {
                // A reply nobody takes (the program gave up waiting) is left to MPI.
                drop(wait_bounded(sending, timeout));
            }
        }
        BUSY.store(false, Ordering::Release);
    }
    // MPI ends with no heartbeat in flight (MPI_Finalize is an MPI call like the others).
    let _mpi = lock(&MPI);
    STOPPED.store(true, Ordering::Release);
    drop(universe);
}

/// Serialises this process's MPI calls between the serving thread and the heartbeat
/// (MPI_THREAD_SERIALIZED).
static MPI: Mutex<()> = Mutex::new(());
/// Whether the serving thread is serving a request now.
static BUSY: AtomicBool = AtomicBool::new(false);
/// Set, under [`MPI`], when MPI is being finalised: the heartbeat makes no more calls.
static STOPPED: AtomicBool = AtomicBool::new(false);

/// Every [`HEARTBEAT`] while a request is being served: an empty [`TAG_ALIVE`] message to
/// rank 0, so that its waits count from the last sign of life, not from the request (a long
/// kernel is not a dead proxy). Skipped while the serving thread is in an MPI call.
fn heartbeat() {
    loop {
        std::thread::sleep(HEARTBEAT);
        if !BUSY.load(Ordering::Acquire) {
            continue;
        }
        {
            // Waits for the serving thread's call in progress (each is short: a probe, one
            // chunk's receive), so a long stream is no silence. Every MPI call here is under
            // the lock, after the checks (this thread may start late, when MPI is already
            // finalised; the request may have been served meanwhile).
            let _mpi = lock(&MPI);
            if STOPPED.load(Ordering::Acquire) {
                return;
            }
            if !BUSY.load(Ordering::Acquire) {
                continue;
            }
            // Empty: sent eagerly, complete at once.
            SimpleCommunicator::world()
                .process_at_rank(0)
                .send_with_tag(&[0u8; 0][..], TAG_ALIVE);
        }
    }
}

/// Waits for a send at most `timeout` under the process's MPI lock; the buffer, or `None`
/// when the send was left to MPI.
fn wait_bounded(sending: Sending, timeout: Duration) -> Option<Box<[u8]>> {
    sending.within(timeout, || lock(&MPI))
}

/// Debug builds (the test suite's) take `OFFLOAD_MPI_PROXY_KILL_AT=<rank>:<request>`: proxy
/// `<rank>` kills itself with SIGKILL when that request arrives (`launch`, `copy to the
/// device`: names as `Request::name` gives them), before serving it, so the fault tests kill
/// a proxy in the middle of exactly that operation.
fn kill_at(me: i32) -> Option<String> {
    if !cfg!(debug_assertions) {
        return None;
    }
    let v = std::env::var("OFFLOAD_MPI_PROXY_KILL_AT").ok()?;
    let (rank, what) = v.split_once(':')?;
    (rank.trim().parse::<i32>().ok()? == me).then(|| what.trim().to_string())
}

/// Debug builds take `OFFLOAD_MPI_PROXY_VERSION=<n>`: the hello claims message version `n`, as
/// a proxy of another build would (the test of the plugin's refusal at start).
fn claimed_version() -> Option<u16> {
    if !cfg!(debug_assertions) {
        return None;
    }
    std::env::var("OFFLOAD_MPI_PROXY_VERSION")
        .ok()?
        .parse()
        .ok()
}

/// The variable naming the OpenMP runtime the proxy loads (default: LLVM's `libomp.so.5`).
const ENV_LIBOMP: &str = "OFFLOAD_MPI_PROXY_LIBOMP";

/// Loads the OpenMP runtime into the proxy, its symbols global. An OpenMP program's host
/// images call it (`__kmpc_fork_teams`, `omp_get_thread_num`): in the program's own process
/// the program links it, and an image JIT-compiled here for the host resolves them from this
/// process as it would there. Where no libomp is installed, nothing is loaded (OpenMP JIT
/// images are then refused by the dynamic loader, naming the symbol).
fn load_openmp_runtime() -> Result<(), String> {
    let named = std::env::var(ENV_LIBOMP).ok().filter(|v| !v.is_empty());
    let candidates: Vec<String> = match &named {
        Some(p) => vec![p.clone()],
        None => [
            "libomp.so.5",
            "/usr/lib/llvm-19/lib/libomp.so.5",
            "libomp.so",
        ]
        .map(String::from)
        .to_vec(),
    };
    for c in &candidates {
        let Ok(name) = std::ffi::CString::new(c.as_str()) else {
            return Err(format!("{ENV_LIBOMP}='{c}' holds a NUL byte"));
        };
        // SAFETY: `name` is a NUL-terminated path; libomp's initialisers only register its
        // runtime (it starts no thread until a parallel region asks).
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if !handle.is_null() {
            return Ok(());
        }
    }
    match named {
        Some(p) => Err(format!("{ENV_LIBOMP}='{p}' could not be loaded")),
        None => Ok(()),
    }
}

/// Streams' chunks over MPI, to and from rank 0.
struct MpiData<'a> {
    client: &'a Process<'a>,
    timeout: Duration,
    /// The read streams' buffers, kept from one stream to the next.
    pool: &'a mut ChunkPool,
}

/// Chunks of a read stream in flight at once.
const IN_FLIGHT: usize = 3;

impl Data for MpiData<'_> {
    fn receive(&mut self, buf: &mut [u8]) -> offload_core::Result<()> {
        let deadline = Instant::now() + self.timeout;
        let mut backoff = Backoff::default();
        loop {
            let mpi = lock(&MPI);
            if let Some(probed) = self.client.immediate_matched_probe_with_tag(TAG_DATA) {
                let n = probed.1.count(u8::equivalent_datatype()) as usize;
                if n != buf.len() {
                    let _ = probed.matched_receive_vec::<u8>();
                    return Err(offload_core::Error::InvalidArgument(format!(
                        "a stream's chunk of {n} bytes where {} were due",
                        buf.len()
                    )));
                }
                probed.0.matched_receive_into(buf);
                return Ok(());
            }
            drop(mpi);
            if Instant::now() > deadline {
                return Err(offload_core::Error::DeviceFailure(format!(
                    "the program sent no chunk of its stream in {:?} (OFFLOAD_MPI_TIMEOUT)",
                    self.timeout
                )));
            }
            backoff.pause();
        }
    }

    fn send(
        &mut self,
        lens: &mut dyn Iterator<Item = (u64, usize)>,
        fill: &mut dyn FnMut(u64, &mut [u8]) -> offload_core::Result<()>,
    ) {
        // Each chunk goes from a buffer of its own, given to MPI until its send completes, then
        // refilled (`Sending`).
        let mut ring: std::collections::VecDeque<Sending> = Default::default();
        let start = |buf: Box<[u8]>, n: usize| {
            let _mpi = lock(&MPI);
            Sending::start(self.client, buf, n, TAG_DATA)
        };
        for (at, n) in lens {
            if ring.len() == IN_FLIGHT {
                let oldest = ring.pop_front().expect("in flight");
                match wait_bounded(oldest, self.timeout) {
                    Some(b) => self.pool.give(b),
                    // The program takes no more: the rest is not sent.
                    None => {
                        ring.into_iter().for_each(Sending::abandon);
                        return;
                    }
                }
            }
            let mut buf = self.pool.take(n);
            let failed = fill(at, &mut buf[..n]).is_err();
            ring.push_back(start(buf, n));
            if failed {
                break;
            }
        }
        ring.push_back(start(Box::new([]), 0));
        while let Some(s) = ring.pop_front() {
            match wait_bounded(s, self.timeout) {
                Some(b) if !b.is_empty() => self.pool.give(b),
                Some(_) => {}
                None => {
                    ring.into_iter().for_each(Sending::abandon);
                    return;
                }
            }
        }
    }

    fn send_from(&mut self, lens: &mut dyn Iterator<Item = (u64, usize)>, memory: &[u8]) {
        let mut ring: std::collections::VecDeque<Sending> = Default::default();
        let start = |bytes: &[u8]| {
            let _mpi = lock(&MPI);
            // SAFETY: every send is waited for below; one not taken in time ends the process
            // (`lent_for_good`), so `memory` is never freed while MPI may read it.
            unsafe { Sending::start_lent(self.client, bytes, TAG_DATA) }
        };
        for (at, n) in lens {
            if ring.len() == IN_FLIGHT {
                let oldest = ring.pop_front().expect("in flight");
                if wait_bounded(oldest, self.timeout).is_none() {
                    lent_for_good(self.timeout);
                }
            }
            ring.push_back(start(&memory[at as usize..at as usize + n]));
        }
        ring.push_back(start(&[]));
        while let Some(s) = ring.pop_front() {
            if wait_bounded(s, self.timeout).is_none() {
                lent_for_good(self.timeout);
            }
        }
    }
}

/// A read stream's chunk sent from device memory was not taken in time: MPI may still read
/// that memory, so nothing of this process may free it. The program took nothing for the
/// timeout (it is gone, or stopped): the proxy ends here, without finalising MPI (which would
/// wait for the send), under the MPI lock (the heartbeat makes no call meanwhile), and without
/// exit handlers (`_exit`: this thread holds the device's region lock, and a handler that
/// waits for the device's threads would keep the proxy from ending).
fn lent_for_good(timeout: Duration) -> ! {
    let _mpi = lock(&MPI);
    STOPPED.store(true, Ordering::Release);
    // `_exit` runs no exit handler: what the node printed goes to mpirun first.
    output::release();
    eprintln!(
        "offload-mpi-proxy (rank {}): the program took no chunk of a read stream in {timeout:?} \
         (OFFLOAD_MPI_TIMEOUT); the proxy ends (MPI may still read the device memory it sent \
         from)",
        SimpleCommunicator::world().rank()
    );
    // SAFETY: `_exit` ends the process at once; nothing runs after it.
    unsafe { libc::_exit(3) }
}
