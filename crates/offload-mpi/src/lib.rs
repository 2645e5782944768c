//! Remote devices over MPI: the message format ([`wire`]), the proxy's side ([`serve`]: a
//! node's devices behind the messages, every handle and range checked by the node's own
//! device layer) and the program's ([`client`]: requests to the proxy ranks of the job, each
//! answered within a deadline). The `offload-mpi-proxy` binary runs [`serve`] under MPI; the
//! `mpi` plugin (crates/plugin-mpi) makes the proxies' devices devices of the program
//! (`mpi:<rank>/<plugin>:<n>`); `offload-mpi-check` speaks the messages directly and
//! exercises every proxy of its job with requests no plugin would send.

pub mod client;
pub mod output;
pub mod serve;
pub mod wire;

/// The MPI tag of a proxy's unprompted hello (its devices), sent to rank 0 at start.
pub const TAG_HELLO: i32 = 0x0ff1;
/// The MPI tag of a request, client to proxy.
pub const TAG_REQUEST: i32 = 0x0ff2;
/// The MPI tag of a reply, proxy to client.
pub const TAG_REPLY: i32 = 0x0ff3;
/// The MPI tag that ends a proxy: an empty message from rank 0, understood by a proxy of any
/// message version (so one the program refused at start ends too).
pub const TAG_SHUTDOWN: i32 = 0x0ff4;
/// The MPI tag of a stream's chunks (either way), which follow their request in order.
pub const TAG_DATA: i32 = 0x0ff5;
/// An empty message a proxy sends rank 0 every [`HEARTBEAT`] while it serves a request that
/// takes long (a long kernel, a queue's synchronisation): a wait is the time since the proxy
/// was last heard from, not since the request.
pub const TAG_ALIVE: i32 = 0x0ff6;
/// How often a busy proxy says it is alive.
pub const HEARTBEAT: std::time::Duration = std::time::Duration::from_millis(250);
/// Plain MPI between rank 0 and a proxy, for the benchmark's reference (benches/mpi_remote.rs):
/// bytes a proxy answers with an empty message...
pub const TAG_ECHO_PUT: i32 = 0x0ff8;
/// ...and a count (one u64) a proxy answers with that many bytes (of its scratch buffer).
pub const TAG_ECHO_GET: i32 = 0x0ff9;

/// The variable bounding every wait for a proxy, in seconds.
pub const ENV_TIMEOUT: &str = "OFFLOAD_MPI_TIMEOUT";

/// `OFFLOAD_MPI_TIMEOUT`: seconds, 1 to 86400; 30 when unset. A bad value is an error naming
/// the variable.
pub fn timeout_secs() -> offload_core::Result<u32> {
    offload_core::env::u32_in_range(&[ENV_TIMEOUT], 1, 86_400, 30)
}
