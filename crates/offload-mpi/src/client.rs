//! The program's side: the proxy ranks of the job, and requests to them, each answered within a
//! deadline. One client serves every thread of the program: MPI calls are made under one lock
//! (so the MPI library need grant no more than `MPI_THREAD_SERIALIZED`), and a reply that
//! another thread's request is waiting for is kept for it.
//!
//! Everything waits by polling (`MPI_Test`, `MPI_Improbe`) against a deadline, never in a
//! blocking call: Debian's Open MPI has no fault tolerance (ULFM), so a receive from a proxy
//! that died would block for ever when the job is kept alive (`mpirun --enable-recovery`); by
//! default `mpirun` ends the whole job when a rank dies.

use crate::wire::{RemoteDevice, Reply, Request, VERSION};
use crate::{TAG_HELLO, TAG_REPLY, TAG_REQUEST, TAG_SHUTDOWN};
use mpi::point_to_point::{Destination, MatchedReceiveVec, Source};
use mpi::request::StaticScope;
use mpi::topology::{Communicator, SimpleCommunicator};
use offload_core::sync::lock;
use offload_core::{Error, Result};
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A proxy rank and the devices it serves.
#[derive(Debug, Clone)]
pub struct Proxy {
    /// Its rank in the job.
    pub rank: i32,
    /// Its devices, in the order requests name them.
    pub devices: Vec<RemoteDevice>,
}

/// The communicator and the replies received for other requests than the one a thread was
/// waiting for.
struct Link {
    world: SimpleCommunicator,
    kept: HashMap<(i32, u64), Reply>,
}

// SAFETY: the communicator is only used under the client's mutex, one MPI call at a time,
// which `MPI_THREAD_SERIALIZED` (what `Client::connect` requires) allows from any thread.
unsafe impl Send for Link {}

/// The proxies of the job, seen from the program's rank.
pub struct Client {
    link: Mutex<Link>,
    proxies: Vec<Proxy>,
    timeout: Duration,
    next_id: AtomicU64,
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
                world,
                kept: HashMap::new(),
            }),
            proxies,
            timeout,
            next_id: AtomicU64::new(1),
        })
    }

    /// The proxies, by rank.
    pub fn proxies(&self) -> &[Proxy] {
        &self.proxies
    }

    /// How long any one wait may take.
    pub fn timeout(&self) -> Duration {
        self.timeout
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

    /// Sends bytes to `rank` as a request as they are (the mutation tests send broken ones),
    /// waiting at most the timeout for the send to complete.
    pub fn send_raw(&self, rank: i32, message: Vec<u8>, what: &str) -> Result<()> {
        let raw: *mut [u8] = Box::into_raw(message.into_boxed_slice());
        // SAFETY: `raw` is a live box, freed only below, once the send no longer reads it.
        let message: &'static [u8] = unsafe { &*raw };
        let deadline = Instant::now() + self.timeout;
        let mut pending = {
            let link = lock(&self.link);
            link.world.process_at_rank(rank).immediate_send_with_tag(
                StaticScope,
                message,
                TAG_REQUEST,
            )
        };
        loop {
            let tested = {
                let _link = lock(&self.link);
                pending.test()
            };
            match tested {
                Ok(_) => {
                    // SAFETY: the send has completed, so MPI no longer reads the block, and
                    // it is the box made above, freed once; `message` is not used again.
                    drop(unsafe { Box::from_raw(raw) });
                    return Ok(());
                }
                Err(again) => pending = again,
            }
            if Instant::now() > deadline {
                // The send may still read the block: both stay leaked.
                std::mem::forget(pending);
                return Err(Error::DeviceFailure(format!(
                    "proxy rank {rank} took no {what} in {:?} (OFFLOAD_MPI_TIMEOUT): it \
                     stopped receiving (dead or stuck)",
                    self.timeout
                )));
            }
            std::thread::yield_now();
        }
    }

    /// The next reply of `rank` for request `id` (any id: `None`), within the timeout; replies
    /// for other requests are kept for their waiters. A reply that does not decode is an
    /// error naming the rank.
    pub fn wait_for(&self, rank: i32, id: Option<u64>, what: &str) -> Result<Reply> {
        self.wait_until(rank, id, what, self.timeout)
    }

    /// Ends proxy `rank` ([`shutdown`]).
    pub fn shutdown(&self, rank: i32) {
        let link = lock(&self.link);
        shutdown(&link.world, &[rank]);
    }

    fn wait_until(
        &self,
        rank: i32,
        id: Option<u64>,
        what: &str,
        timeout: Duration,
    ) -> Result<Reply> {
        let deadline = Instant::now() + timeout;
        loop {
            {
                let mut link = lock(&self.link);
                if let Some(id) = id
                    && let Some(r) = link.kept.remove(&(rank, id))
                {
                    return Ok(r);
                }
                let probed = link
                    .world
                    .process_at_rank(rank)
                    .immediate_matched_probe_with_tag(TAG_REPLY);
                if let Some(probed) = probed {
                    let bytes = probed.matched_receive_vec::<u8>().0;
                    let (got, reply) = Reply::decode(&bytes).map_err(|e| {
                        e.context(format!("a reply of proxy rank {rank} (waiting for {what})"))
                    })?;
                    if id.is_none_or(|id| id == got) {
                        return Ok(reply);
                    }
                    link.kept.insert((rank, got), reply);
                    continue;
                }
            }
            if Instant::now() > deadline {
                return Err(Error::DeviceFailure(format!(
                    "proxy rank {rank} did not answer {what} in {timeout:?} (OFFLOAD_MPI_TIMEOUT)"
                )));
            }
            std::thread::yield_now();
        }
    }
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

/// Ends the proxies `ranks` of `world`: an empty [`TAG_SHUTDOWN`] message to each, each send
/// given a second to complete (a proxy that is gone is not waited for longer).
pub fn shutdown(world: &SimpleCommunicator, ranks: &[i32]) {
    static EMPTY: [u8; 0] = [];
    for &rank in ranks {
        let mut pending = world.process_at_rank(rank).immediate_send_with_tag(
            StaticScope,
            &EMPTY[..],
            TAG_SHUTDOWN,
        );
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            match pending.test() {
                Ok(_) => break,
                Err(again) => pending = again,
            }
            if Instant::now() > deadline {
                std::mem::forget(pending);
                break;
            }
            std::thread::yield_now();
        }
    }
}
