//! Remote devices over MPI (issue 38, first part): the message format ([`wire`]), the proxy's
//! side ([`serve`]: a node's devices behind the messages, every handle and range checked) and
//! the program's ([`client`]: requests to the proxy ranks of the job, each answered within a
//! deadline). The `offload-mpi-proxy` binary runs [`serve`] under MPI; `offload-mpi-check`
//! is a client that exercises every proxy of its job. The plugin that makes the proxies'
//! devices devices of the runtime (`mpi:<rank>/<plugin>:<n>`) builds on these.

pub mod client;
pub mod serve;
pub mod wire;

/// The MPI tag of a proxy's unprompted hello (its devices), sent to rank 0 at start.
pub const TAG_HELLO: i32 = 0x0ff1;
/// The MPI tag of a request, client to proxy.
pub const TAG_REQUEST: i32 = 0x0ff2;
/// The MPI tag of a reply, proxy to client.
pub const TAG_REPLY: i32 = 0x0ff3;
