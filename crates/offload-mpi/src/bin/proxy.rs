//! `offload-mpi-proxy`: serves its node's devices to rank 0 of an MPI job
//! (`mpirun -n 1 ./app : -n N offload-mpi-proxy`). It says hello (its devices) to rank 0, then
//! answers each request until a shutdown.

use mpi::point_to_point::{Destination, MatchedReceiveVec, Source};
use mpi::topology::Communicator;
use offload_mpi::serve::Server;
use offload_mpi::wire::Reply;
use offload_mpi::{TAG_HELLO, TAG_REPLY, TAG_REQUEST};

fn main() {
    let Some((universe, _)) = mpi::initialize_with_threading(mpi::Threading::Multiple) else {
        eprintln!("offload-mpi-proxy: MPI could not be initialised (start it under mpirun)");
        std::process::exit(2);
    };
    let world = universe.world();
    let me = world.rank();
    // The runtime lives as long as the proxy serves its devices.
    let runtime = offload::Runtime::from_env();
    let devices = match &runtime {
        Ok(rt) => rt.devices(),
        Err(e) => {
            eprintln!("offload-mpi-proxy (rank {me}): no runtime: {e}");
            Vec::new()
        }
    };
    let mut server = Server::new(devices);
    let hello = server.hello().unwrap_or_else(|e| Reply::failed(&e));
    let client = world.process_at_rank(0);
    client.send_with_tag(&hello.encode(0)[..], TAG_HELLO);
    loop {
        let (bytes, _) = client
            .matched_probe_with_tag(TAG_REQUEST)
            .matched_receive_vec::<u8>();
        let answer = server.answer(&bytes);
        client.send_with_tag(&answer.reply[..], TAG_REPLY);
        if answer.shutdown {
            break;
        }
    }
}
