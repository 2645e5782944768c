//! The program's side: the proxy ranks of the job, and requests to them, each answered within a
//! deadline. One client serves every thread of the program: MPI calls are made under one lock
//! (so the MPI library need grant no more than `MPI_THREAD_SERIALIZED`), and a reply that
//! another thread's request is waiting for is kept for it.
//!
//! Everything waits by polling (`MPI_Test`, `MPI_Improbe`) against a deadline, never in a
//! blocking call (a receive is made only of a message already matched by a probe): Debian's
//! Open MPI has no fault tolerance (ULFM), so a receive from a proxy that died would block for
//! ever when the job is kept alive (`mpirun --enable-recovery`); by default `mpirun` ends the
//! whole job when a rank dies. The deadline is the time since the proxy was last heard from
//! (a busy proxy sends heartbeats, [`crate::TAG_ALIVE`]); past it the rank is failed for
//! good, and every later request to it fails at once.

use crate::wire::{RemoteDevice, Reply, Request, VERSION};
use crate::{TAG_ALIVE, TAG_DATA, TAG_HELLO, TAG_REPLY, TAG_REQUEST, TAG_SHUTDOWN};
use mpi::datatype::Equivalence;
use mpi::point_to_point::{Destination, MatchedReceiveVec, Source};
use mpi::request::StaticScope;
use mpi::topology::{Communicator, SimpleCommunicator};
use offload_core::sync::lock;
use offload_core::{Error, Result};
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A proxy rank and the devices it serves.
#[derive(Debug, Clone)]
pub struct Proxy {
    /// Its rank in the job.
    pub rank: i32,
    /// Its devices, in the order requests name them.
    pub devices: Vec<RemoteDevice>,
}

/// The communicator and what the client knows of each proxy: the replies received for other
/// requests than the one a thread was waiting for, when it was last heard from, and why it
/// failed, if it did.
struct Link {
    world: SimpleCommunicator,
    kept: HashMap<(i32, u64), Reply>,
    /// By rank.
    heard: Vec<Option<Instant>>,
    failed: HashMap<i32, Error>,
    /// By rank: replies received since its heartbeats were last read.
    undrained: Vec<u32>,
    /// MPI has ended for this process (its exit): no more calls.
    closed: bool,
}

impl Link {
    /// An error once MPI has ended for this process.
    fn open(&self) -> Result<()> {
        if self.closed {
            return Err(Error::DeviceFailure(
                "MPI has ended for this process (the program is exiting): no remote device takes \
                 work any more"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Reads the heartbeats `rank` sent (they are not to pile up in MPI's queue), noting when
    /// it was heard from.
    fn drain_alive(&mut self, rank: i32) {
        while let Some(p) = self
            .world
            .process_at_rank(rank)
            .immediate_matched_probe_with_tag(TAG_ALIVE)
        {
            drop(p.matched_receive_vec::<u8>());
            self.hear(rank);
        }
        if let Some(n) = self.undrained.get_mut(rank as usize) {
            *n = 0;
        }
    }

    /// Notes that `rank` was heard from now.
    fn hear(&mut self, rank: i32) {
        if let Some(h) = self.heard.get_mut(rank as usize) {
            *h = Some(Instant::now());
        }
    }
}

/// Heartbeats are read after this many replies, or after a reply that was slow to come: a
/// proxy sends one every [`crate::HEARTBEAT`] of a request that is being served, so a run of
/// quick replies leaves few to read (reading them costs a probe a reply).
const DRAIN_EVERY: u32 = 64;

/// Polls between two looks at the clock, for a wait's deadline.
const CLOCK_EVERY: u32 = 32;

/// One wait for a proxy: it fails once the proxy has said nothing (no reply, no chunk, no
/// heartbeat) for the timeout.
struct Watch {
    rank: i32,
    started: Instant,
    deadline: Instant,
}

// SAFETY: the communicator is only used under the client's mutex, one MPI call at a time,
// which `MPI_THREAD_SERIALIZED` (what `Client::connect` requires) allows from any thread.
unsafe impl Send for Link {}

/// How a wait polls: a tight spin first (an answer usually comes within microseconds, and a
/// yield is a system call), then yielding the core to others, and after 5 ms short sleeps (a
/// long wait, an idle proxy, must not take a core from the node's host devices).
#[derive(Debug, Default)]
pub struct Backoff {
    spins: u32,
    yielding_since: Option<Instant>,
}

impl Backoff {
    /// Whether the tight spin is over (the wait is no longer short).
    pub fn spent(&self) -> bool {
        self.spins >= SPINS
    }

    /// One pause between two polls.
    pub fn pause(&mut self) {
        if self.spins < SPINS {
            self.spins += 1;
            std::hint::spin_loop();
            return;
        }
        let since = *self.yielding_since.get_or_insert_with(Instant::now);
        if since.elapsed() < Duration::from_millis(5) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// Polls a wait spins for before it yields.
const SPINS: u32 = 2_000;

/// Chunks of a write stream in flight at once.
const IN_FLIGHT: usize = 4;

/// The buffers of a rank's streams, kept from one stream to the next: a fresh buffer of a
/// megabyte costs its page faults (glibc maps it anew, and unmaps it when freed), more than the
/// copy into it. A buffer left with MPI (a send abandoned) never comes back.
#[derive(Debug, Default)]
pub struct ChunkPool {
    free: Vec<Box<[u8]>>,
}

impl ChunkPool {
    /// A buffer of at least `n` bytes: a kept one, or a new one of `n`.
    pub fn take(&mut self, n: usize) -> Box<[u8]> {
        match self.free.iter().position(|b| b.len() >= n) {
            Some(i) => self.free.swap_remove(i),
            None => vec![0u8; n].into_boxed_slice(),
        }
    }

    /// Keeps `buf` for a later stream (at most [`ChunkPool::KEPT`] buffers, the largest).
    pub fn give(&mut self, buf: Box<[u8]>) {
        self.free.push(buf);
        if self.free.len() > Self::KEPT {
            self.free.sort_by_key(|b| std::cmp::Reverse(b.len()));
            self.free.truncate(Self::KEPT);
        }
    }

    /// Buffers kept: one more than a stream has in flight.
    pub const KEPT: usize = IN_FLIGHT + 1;
}

/// The proxies of the job, seen from the program's rank.
pub struct Client {
    link: Mutex<Link>,
    /// One stream at a time per proxy (its chunks follow its request in order), and the
    /// buffers its streams reuse.
    streams: Vec<(i32, Mutex<ChunkPool>)>,
    proxies: Vec<Proxy>,
    timeout: Duration,
    next_id: AtomicU64,
    /// Whether any rank failed ([`Client::check_rank`]'s question without the lock).
    any_failed: AtomicBool,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Client({} proxies, timeout {:?})",
            self.proxies.len(),
            self.timeout
        )
    }
}

impl Client {
    /// Waits for the hello of every other rank of `world` (each must be a proxy), at most
    /// `timeout` in all. A rank that says nothing in time, or speaks another message version,
    /// is an error naming it (and both versions).
    ///
    /// MPI must have been initialised with at least `MPI_THREAD_SERIALIZED`.
    pub fn connect(world: SimpleCommunicator, timeout: Duration) -> Result<Client> {
        let me = world.rank();
        let want: Vec<i32> = (0..world.size()).filter(|r| *r != me).collect();
        let deadline = Instant::now() + timeout;
        let mut proxies: Vec<Proxy> = Vec::new();
        while proxies.len() < want.len() {
            match world
                .any_process()
                .immediate_matched_probe_with_tag(TAG_HELLO)
            {
                Some(probed) => {
                    let rank = probed.1.source_rank();
                    let (bytes, _) = probed.matched_receive_vec::<u8>();
                    proxies.push(Proxy {
                        rank,
                        devices: hello_devices(rank, &bytes)?,
                    });
                }
                None if Instant::now() > deadline => {
                    let silent: Vec<String> = want
                        .iter()
                        .filter(|r| !proxies.iter().any(|p| p.rank == **r))
                        .map(|r| r.to_string())
                        .collect();
                    return Err(Error::NoDevice(format!(
                        "rank(s) {} of the job sent no proxy hello in {timeout:?}: start them \
                         as offload-mpi-proxy (mpirun -n 1 ./app : -n N offload-mpi-proxy)",
                        silent.join(", ")
                    )));
                }
                None => std::thread::sleep(Duration::from_micros(50)),
            }
        }
        proxies.sort_by_key(|p| p.rank);
        Ok(Client {
            link: Mutex::new(Link {
                kept: HashMap::new(),
                heard: vec![None; usize::try_from(world.size()).unwrap_or(0)],
                failed: HashMap::new(),
                undrained: vec![0; usize::try_from(world.size()).unwrap_or(0)],
                closed: false,
                world,
            }),
            any_failed: AtomicBool::new(false),
            streams: proxies
                .iter()
                .map(|p| (p.rank, Mutex::new(ChunkPool::default())))
                .collect(),
            proxies,
            timeout,
            next_id: AtomicU64::new(1),
        })
    }

    /// The proxies, by rank.
    pub fn proxies(&self) -> &[Proxy] {
        &self.proxies
    }

    /// An error if proxy `rank` failed (it stopped answering): every later request to it fails
    /// at once, naming why.
    pub fn check_rank(&self, rank: i32) -> Result<()> {
        if !self.any_failed.load(Ordering::Acquire) {
            // Whether MPI has ended is checked again, under the lock, before every MPI call.
            return Ok(());
        }
        let link = lock(&self.link);
        link.open()?;
        match link.failed.get(&rank) {
            Some(e) => Err(Error::DeviceFailure(format!(
                "proxy rank {rank} failed earlier and takes no more work: {}",
                e.message()
            ))),
            None => Ok(()),
        }
    }

    fn watch(&self, rank: i32) -> Result<Watch> {
        self.check_rank(rank)?;
        let now = Instant::now();
        Ok(Watch {
            rank,
            started: now,
            deadline: now + self.timeout,
        })
    }

    /// At a watch's deadline: the proxy's heartbeats are read; if it was heard from within
    /// the timeout the wait goes on (`None`), else the rank is failed for good and the error
    /// names it and `what` it did not answer.
    fn expired(&self, w: &mut Watch, what: &str) -> Option<Error> {
        let mut link = lock(&self.link);
        if let Err(e) = link.open() {
            return Some(e);
        }
        link.drain_alive(w.rank);
        let last = link
            .heard
            .get(w.rank as usize)
            .copied()
            .flatten()
            .map_or(w.started, |h| h.max(w.started));
        if last.elapsed() < self.timeout {
            w.deadline = last + self.timeout;
            return None;
        }
        let e = Error::DeviceFailure(format!(
            "proxy rank {} did not answer {what} in {:?} (OFFLOAD_MPI_TIMEOUT): it sent nothing \
             in that time, not even that it was busy",
            w.rank, self.timeout
        ));
        link.failed.insert(w.rank, e.clone());
        self.any_failed.store(true, Ordering::Release);
        // Replies it may still send are for requests nobody waits for any more.
        link.kept.retain(|(r, _), _| *r != w.rank);
        Some(e)
    }

    /// Sends `request` to proxy `rank` and, if the proxy answers it ([`Request::answered`]),
    /// waits for the reply, at most the client's timeout. A [`Reply::Failed`] comes back as
    /// the proxy's error, with the rank and the request named. An unanswered request returns
    /// [`Reply::Done`] once sent.
    pub fn request(&self, rank: i32, request: &Request) -> Result<Reply> {
        let id = self.post(rank, request)?;
        if !request.answered() {
            return Ok(Reply::Done);
        }
        self.wait(rank, id, request.name())
    }

    /// Sends `request` to `rank` and returns its id, without waiting for a reply.
    pub fn post(&self, rank: i32, request: &Request) -> Result<u64> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.send_raw(rank, request.encode(id), request.name())?;
        Ok(id)
    }

    /// Waits for the reply to request `id` of `rank` (`what`: the request, for messages).
    pub fn wait(&self, rank: i32, id: u64, what: &str) -> Result<Reply> {
        let reply = self.wait_for(rank, Some(id), what)?;
        match reply.error() {
            Some(e) => Err(e.context(format!("proxy rank {rank}, {what}"))),
            None => Ok(reply),
        }
    }

    /// A synchronous copy to proxy `rank` as a stream (`request` is its
    /// [`Request::WriteStream`]): the request, then `data` in chunks, a few in flight at once
    /// (each copied into a buffer of the stream's while MPI moves the ones before), then the
    /// reply. A proxy that takes no chunk within the timeout fails the copy; the chunks it
    /// never took stay with MPI (their buffers are never reused), not the caller's memory.
    pub fn write_stream(&self, rank: i32, request: &Request, data: &[u8]) -> Result<Reply> {
        let Request::WriteStream { len, chunk, .. } = *request else {
            return Err(Error::InvalidArgument(format!(
                "{} is no write stream",
                request.name()
            )));
        };
        if len != data.len() as u64 {
            return Err(Error::InvalidArgument(format!(
                "a write stream of {len} bytes given {} bytes",
                data.len()
            )));
        }
        let mut pool = lock(self.stream_lock(rank)?);
        let id = self.post(rank, request)?;
        let what = request.name();
        let mut ring = std::collections::VecDeque::new();
        let mut sent = || -> Result<()> {
            for (at, n) in crate::wire::chunks(len, chunk) {
                if ring.len() == IN_FLIGHT {
                    let oldest = ring.pop_front().expect("in flight");
                    pool.give(self.complete(rank, what, oldest)?);
                }
                let mut buf = pool.take(chunk as usize);
                buf[..n].copy_from_slice(&data[at as usize..at as usize + n]);
                let link = lock(&self.link);
                link.open()?;
                ring.push_back(Sending::start(
                    &link.world.process_at_rank(rank),
                    buf,
                    n,
                    TAG_DATA,
                ));
            }
            while let Some(oldest) = ring.pop_front() {
                pool.give(self.complete(rank, what, oldest)?);
            }
            Ok(())
        };
        if let Err(e) = sent() {
            ring.into_iter().for_each(Sending::abandon);
            return Err(e);
        }
        // A long stream kept the proxy busy: its heartbeats are read now.
        self.drain(rank);
        self.wait(rank, id, what)
    }

    /// Waits for a send, at most the timeout; its buffer, to reuse. A send the proxy does not
    /// take in time is left to MPI (its buffer with it) and fails the operation.
    fn complete(&self, rank: i32, what: &str, mut pending: Sending) -> Result<Box<[u8]>> {
        let mut w = self.watch(rank)?;
        let mut backoff = Backoff::default();
        loop {
            let tested = {
                let mut link = lock(&self.link);
                link.open()?;
                let tested = pending.test();
                if tested.is_ok() {
                    // The proxy took it: a sign of life.
                    link.hear(rank);
                }
                tested
            };
            match tested {
                Ok(buf) => return Ok(buf),
                Err(again) => pending = again,
            }
            if Instant::now() > w.deadline
                && let Some(e) = self.expired(&mut w, what)
            {
                pending.abandon();
                return Err(e);
            }
            backoff.pause();
        }
    }

    /// A synchronous copy from proxy `rank` as a stream (`request` is its
    /// [`Request::ReadStream`]): the chunks are received straight into `dst`, then the reply.
    /// Fewer bytes than asked (the proxy's copy failed) come with the reply's error.
    pub fn read_stream(&self, rank: i32, request: &Request, dst: &mut [u8]) -> Result<Reply> {
        let _one = lock(self.stream_lock(rank)?);
        let id = self.post(rank, request)?;
        let what = request.name();
        let mut got = 0usize;
        let mut overflow = false;
        let mut w = self.watch(rank)?;
        let mut backoff = Backoff::default();
        loop {
            let mut link = lock(&self.link);
            link.open()?;
            let probed = link
                .world
                .process_at_rank(rank)
                .immediate_matched_probe_with_tag(TAG_DATA);
            if let Some(probed) = probed {
                let n = probed.1.count(u8::equivalent_datatype()) as usize;
                if n == 0 {
                    // The end of the stream; a long one kept the proxy busy, and its
                    // heartbeats are read now.
                    drop(probed.matched_receive_vec::<u8>());
                    link.drain_alive(rank);
                    break;
                }
                if n > dst.len() - got {
                    overflow = true;
                    drop(probed.matched_receive_vec::<u8>());
                } else {
                    probed.0.matched_receive_into(&mut dst[got..got + n]);
                    got += n;
                }
                link.hear(rank);
                continue;
            }
            drop(link);
            if Instant::now() > w.deadline
                && let Some(e) = self.expired(&mut w, what)
            {
                return Err(e);
            }
            backoff.pause();
        }
        let reply = self.wait(rank, id, what)?;
        if overflow || got != dst.len() {
            return Err(Error::DeviceFailure(format!(
                "proxy rank {rank} sent {} bytes for a {what} of {} bytes",
                if overflow {
                    "more".to_string()
                } else {
                    got.to_string()
                },
                dst.len()
            )));
        }
        Ok(reply)
    }

    /// Reads the heartbeats `rank` sent.
    fn drain(&self, rank: i32) {
        let mut link = lock(&self.link);
        if link.open().is_ok() {
            link.drain_alive(rank);
        }
    }

    fn stream_lock(&self, rank: i32) -> Result<&Mutex<ChunkPool>> {
        self.streams
            .iter()
            .find(|(r, _)| *r == rank)
            .map(|(_, m)| m)
            .ok_or_else(|| Error::InvalidArgument(format!("rank {rank} is no proxy of this job")))
    }

    /// Sends bytes to `rank` as a request as they are (the mutation tests send broken ones),
    /// waiting at most the timeout for the send to complete.
    pub fn send_raw(&self, rank: i32, message: Vec<u8>, what: &str) -> Result<()> {
        self.check_rank(rank)?;
        let n = message.len();
        // A small message completes at once (MPI copies it out): tested under the same lock.
        let sent = {
            let link = lock(&self.link);
            link.open()?;
            Sending::start(
                &link.world.process_at_rank(rank),
                message.into_boxed_slice(),
                n,
                TAG_REQUEST,
            )
            .test()
        };
        match sent {
            Ok(_) => Ok(()),
            Err(pending) => self.complete(rank, what, pending).map(drop),
        }
    }

    /// The next reply of `rank` for request `id` (any id: `None`), within the timeout (counted
    /// from when the proxy was last heard from); replies for other requests are kept for their
    /// waiters. A reply that does not decode is an error naming the rank.
    pub fn wait_for(&self, rank: i32, id: Option<u64>, what: &str) -> Result<Reply> {
        let mut w = self.watch(rank)?;
        let mut backoff = Backoff::default();
        let mut polls = 0u32;
        loop {
            polls = polls.wrapping_add(1);
            let output = {
                let mut link = lock(&self.link);
                if let Some(id) = id
                    && !link.kept.is_empty()
                    && let Some(r) = link.kept.remove(&(rank, id))
                {
                    return Ok(r);
                }
                link.open()?;
                let probed = link
                    .world
                    .process_at_rank(rank)
                    .immediate_matched_probe_with_tag(TAG_REPLY);
                match probed {
                    Some(probed) => {
                        let bytes = probed.matched_receive_vec::<u8>().0;
                        link.hear(rank);
                        let quick = link.undrained.get_mut(rank as usize).is_some_and(|n| {
                            *n += 1;
                            *n < DRAIN_EVERY
                        });
                        if !quick || backoff.spent() {
                            link.drain_alive(rank);
                        }
                        let (got, reply) = Reply::decode(&bytes).map_err(|e| {
                            e.context(format!("a reply of proxy rank {rank} (waiting for {what})"))
                        })?;
                        match reply {
                            Reply::Output { bytes } => {
                                // Under the lock: no other thread receives the reply it
                                // precedes (and goes on) before it is written.
                                print_c_stdout(&bytes);
                                true
                            }
                            reply if id.is_none_or(|id| id == got) => return Ok(reply),
                            reply => {
                                link.kept.insert((rank, got), reply);
                                continue;
                            }
                        }
                    }
                    None => false,
                }
            };
            if output {
                continue;
            }
            if polls % CLOCK_EVERY == 0
                && Instant::now() > w.deadline
                && let Some(e) = self.expired(&mut w, what)
            {
                return Err(e);
            }
            backoff.pause();
        }
    }

    /// Ends every other rank of the job ([`shutdown`]), the failed ones too (a proxy that
    /// stopped answering may be alive, and waits for its end like the others), then runs
    /// `then` (MPI_Finalize, when `then` is given true: no rank failed) still under the
    /// client's lock: no thread of the program makes an MPI call meanwhile, nor after.
    pub fn shutdown_all_then(&self, then: impl FnOnce(bool)) {
        let mut link = lock(&self.link);
        if link.closed {
            return;
        }
        let me = link.world.rank();
        let others: Vec<i32> = (0..link.world.size()).filter(|r| *r != me).collect();
        let finalize = link.failed.is_empty();
        shutdown(&link.world, &others, finalize);
        then(finalize);
        // MPI is over for this process: every later call fails, naming why.
        link.closed = true;
    }

    /// Ends proxy `rank` ([`shutdown`]).
    pub fn shutdown(&self, rank: i32) {
        let link = lock(&self.link);
        if link.open().is_ok() {
            shutdown(&link.world, &[rank], true);
        }
    }
}

/// Writes a proxy's output to this process's C `stdout` stream (buffered as the program's own
/// `printf`, so a region's lines land between the program's as they would locally).
fn print_c_stdout(bytes: &[u8]) {
    unsafe extern "C" {
        // glibc's (and musl's) standard output stream.
        static stdout: *mut libc::FILE;
    }
    // SAFETY: `stdout` is the C library's stream, valid for the process's life; fwrite takes
    // the stream's lock and copies `bytes`, which live through the call.
    unsafe { libc::fwrite(bytes.as_ptr().cast(), 1, bytes.len(), stdout) };
}

/// The devices of rank `rank`'s hello; another version, or a message that is no hello, is an
/// error naming the rank.
fn hello_devices(rank: i32, bytes: &[u8]) -> Result<Vec<RemoteDevice>> {
    // The version is read before the message is decoded: a proxy of another version has
    // another layout, and the error must say which versions met.
    if bytes.len() >= 8 && bytes[..4] == crate::wire::MAGIC.to_le_bytes() {
        let theirs = u16::from_le_bytes([bytes[4], bytes[5]]);
        if theirs != VERSION {
            return Err(Error::AbiMismatch(format!(
                "rank {rank} is an offload-mpi-proxy speaking message version {theirs}; this \
                 program's mpi plugin speaks version {VERSION}: run the proxy and the plugin \
                 of the same build"
            )));
        }
    }
    let (_, reply) =
        Reply::decode(bytes).map_err(|e| e.context(format!("the hello of rank {rank}")))?;
    match reply {
        Reply::Hello { devices, .. } => Ok(devices),
        Reply::Failed { message, .. } => Err(Error::NoDevice(format!(
            "proxy rank {rank} serves no device: {message}"
        ))),
        other => Err(Error::InvalidArgument(format!(
            "rank {rank} sent {} where its hello was expected",
            other.name()
        ))),
    }
}

/// Ends the proxies `ranks` of `world`: a [`TAG_SHUTDOWN`] message to each, each send given a
/// second to complete (a proxy that is gone is not waited for longer). Empty: the proxy
/// finalises MPI and ends; one byte (`finalize` false): it ends without finalising, because a
/// rank of the job died and MPI_Finalize would wait for it (Open MPI's does, under
/// `--enable-recovery`).
pub fn shutdown(world: &SimpleCommunicator, ranks: &[i32], finalize: bool) {
    let message: &[u8] = if finalize { &[] } else { &[0] };
    for &rank in ranks {
        let sending = Sending::start(
            &world.process_at_rank(rank),
            message.into(),
            message.len(),
            TAG_SHUTDOWN,
        );
        // The caller holds the client's lock (or is the only thread making MPI calls).
        sending.within(Duration::from_secs(1), || ());
    }
}

/// A message being sent from a buffer of its own: the box is given to MPI until the send
/// completes, then taken back (to reuse) once. A send abandoned, or dropped before it
/// completed (an error on the way), is left to MPI with its box for good.
pub struct Sending {
    raw: *mut [u8],
    request: Option<mpi::request::Request<'static, [u8], StaticScope>>,
}

impl std::fmt::Debug for Sending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sending({} bytes)", self.raw.len())
    }
}

impl Sending {
    /// Sends the first `n` bytes of `buf` to `to` with `tag`.
    pub fn start(
        to: &mpi::topology::Process<'_>,
        buf: Box<[u8]>,
        n: usize,
        tag: mpi::Tag,
    ) -> Sending {
        let raw = Box::into_raw(buf);
        // SAFETY: `raw` is a live box, taken back only when the send has completed (`test`)
        // or never (`abandon`, `drop`).
        let bytes: &'static [u8] = unsafe { &(&*raw)[..n] };
        let request = to.immediate_send_with_tag(StaticScope, bytes, tag);
        Sending {
            raw,
            request: Some(request),
        }
    }

    /// Sends `bytes`, memory that is not the send's own, to `to` with `tag`; its buffer (to
    /// take back once it completes) is empty.
    ///
    /// # Safety
    /// `bytes` stays allocated and unchanged until the send has completed, and for good if the
    /// send is abandoned (or dropped unfinished).
    pub unsafe fn start_lent(
        to: &mpi::topology::Process<'_>,
        bytes: &[u8],
        tag: mpi::Tag,
    ) -> Sending {
        // SAFETY: the caller keeps `bytes` for as long as MPI may read them (the contract).
        let lent: &'static [u8] =
            unsafe { std::slice::from_raw_parts(bytes.as_ptr(), bytes.len()) };
        let request = to.immediate_send_with_tag(StaticScope, lent, tag);
        Sending {
            raw: Box::into_raw(Box::<[u8]>::default()),
            request: Some(request),
        }
    }

    /// The buffer, if the send has completed.
    pub fn test(mut self) -> std::result::Result<Box<[u8]>, Sending> {
        let request = self.request.take().expect("a live send");
        match request.test() {
            // SAFETY: the send completed, so MPI reads the box no more; taken back once (the
            // request is gone, so `drop` leaves the box alone).
            Ok(_) => Ok(unsafe { Box::from_raw(self.raw) }),
            Err(request) => {
                self.request = Some(request);
                Err(self)
            }
        }
    }

    /// Waits for the send at most `timeout`, taking `guard` (the process's MPI lock) around
    /// each test; the buffer, or `None` when the send was left to MPI ([`Sending::abandon`]).
    pub fn within<G>(mut self, timeout: Duration, guard: impl Fn() -> G) -> Option<Box<[u8]>> {
        let deadline = Instant::now() + timeout;
        let mut backoff = Backoff::default();
        loop {
            let tested = {
                let _held = guard();
                self.test()
            };
            match tested {
                Ok(buf) => return Some(buf),
                Err(again) => self = again,
            }
            if Instant::now() > deadline {
                self.abandon();
                return None;
            }
            backoff.pause();
        }
    }

    /// Leaves the send to MPI, and its buffer with it, for good.
    pub fn abandon(self) {}
}

impl Drop for Sending {
    fn drop(&mut self) {
        // Not completed: MPI may still read the box, so both stay (rsmpi's request panics if
        // dropped unfinished).
        if let Some(request) = self.request.take() {
            std::mem::forget(request);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ChunkPool;

    #[test]
    fn a_chunk_pool_reuses_buffers_large_enough_and_keeps_the_largest() {
        let mut pool = ChunkPool::default();
        let a = pool.take(100);
        assert_eq!(a.len(), 100);
        let at = a.as_ptr();
        pool.give(a);
        // A smaller request reuses the kept buffer; a larger one gets a new buffer.
        let b = pool.take(60);
        assert_eq!((b.as_ptr(), b.len()), (at, 100));
        let c = pool.take(200);
        assert_eq!(c.len(), 200);
        pool.give(b);
        pool.give(c);
        for n in 1..=ChunkPool::KEPT {
            pool.give(vec![0u8; n].into_boxed_slice());
        }
        assert_eq!(pool.free.len(), ChunkPool::KEPT);
        let mut kept: Vec<usize> = pool.free.iter().map(|b| b.len()).collect();
        kept.sort_unstable();
        let mut want: Vec<usize> = (3..=ChunkPool::KEPT).chain([100, 200]).collect();
        want.sort_unstable();
        assert_eq!(kept, want, "the largest buffers stay");
    }
}
