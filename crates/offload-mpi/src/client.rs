//! The program's side: the proxy ranks of the job, and requests to them, each answered within a
//! deadline.
//!
//! Everything waits by polling (`MPI_Improbe`) against a deadline, never in a blocking receive:
//! Debian's Open MPI has no fault tolerance (ULFM), so a receive from a proxy that died would
//! block for ever when the job is kept alive (`mpirun --enable-recovery`); by default `mpirun`
//! ends the whole job when a rank dies.

use crate::wire::{RemoteDevice, Reply, Request, VERSION};
use crate::{TAG_HELLO, TAG_REPLY, TAG_REQUEST};
use mpi::point_to_point::{Destination, MatchedReceiveVec, Source};
use mpi::topology::{Communicator, SimpleCommunicator};
use offload_core::{Error, Result};
use std::time::{Duration, Instant};

/// A proxy rank and the devices it serves.
#[derive(Debug, Clone)]
pub struct Proxy {
    /// Its rank in the job.
    pub rank: i32,
    /// Its devices, in the order requests name them.
    pub devices: Vec<RemoteDevice>,
}

/// The proxies of the job, seen from the program's rank.
pub struct Client {
    world: SimpleCommunicator,
    proxies: Vec<Proxy>,
    timeout: Duration,
    next_id: u64,
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
    /// is an error naming it.
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
                    let (_, reply) = Reply::decode(&bytes)
                        .map_err(|e| e.context(format!("the hello of rank {rank}")))?;
                    match reply {
                        Reply::Hello { version, devices } if version == VERSION => {
                            proxies.push(Proxy { rank, devices })
                        }
                        Reply::Hello { version, .. } => {
                            return Err(Error::AbiMismatch(format!(
                                "rank {rank} is a proxy of message version {version}; this \
                                 program speaks version {VERSION}"
                            )));
                        }
                        other => {
                            return Err(Error::InvalidArgument(format!(
                                "rank {rank} sent {other:?} where its hello was expected"
                            )));
                        }
                    }
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
                None => std::thread::yield_now(),
            }
        }
        proxies.sort_by_key(|p| p.rank);
        Ok(Client {
            world,
            proxies,
            timeout,
            next_id: 1,
        })
    }

    /// The proxies, by rank.
    pub fn proxies(&self) -> &[Proxy] {
        &self.proxies
    }

    /// Sends `request` to proxy `rank` and waits for its reply, at most the client's timeout.
    /// A [`Reply::Failed`] comes back as the proxy's error, with the rank and the request
    /// named.
    pub fn request(&mut self, rank: i32, request: &Request) -> Result<Reply> {
        let id = self.next_id;
        self.next_id += 1;
        self.send_raw(rank, &request.encode(id));
        let reply = self.wait_reply(rank, request.name())?;
        let (got, reply) = Reply::decode(&reply)
            .map_err(|e| e.context(format!("the reply of rank {rank} to {}", request.name())))?;
        if got != id {
            return Err(Error::InvalidArgument(format!(
                "rank {rank} answered request {got} where {id} ({}) was asked",
                request.name()
            )));
        }
        match reply.error() {
            Some(e) => Err(e.context(format!("rank {rank}, {}", request.name()))),
            None => Ok(reply),
        }
    }

    /// Sends bytes as a request to `rank` as they are (the mutation tests send broken ones).
    pub fn send_raw(&self, rank: i32, message: &[u8]) {
        self.world
            .process_at_rank(rank)
            .send_with_tag(message, TAG_REQUEST);
    }

    /// The next reply of `rank`, within the timeout.
    pub fn wait_reply(&self, rank: i32, what: &str) -> Result<Vec<u8>> {
        let deadline = Instant::now() + self.timeout;
        let process = self.world.process_at_rank(rank);
        loop {
            if let Some(probed) = process.immediate_matched_probe_with_tag(TAG_REPLY) {
                return Ok(probed.matched_receive_vec::<u8>().0);
            }
            if Instant::now() > deadline {
                return Err(Error::DeviceFailure(format!(
                    "proxy rank {rank} did not answer {what} in {:?} (OFFLOAD_MPI_TIMEOUT)",
                    self.timeout
                )));
            }
            std::thread::yield_now();
        }
    }
}
