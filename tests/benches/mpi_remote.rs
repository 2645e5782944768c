//! Remote devices over MPI against MPI itself, in one job on this machine:
//! `mpirun -n 1 <this> --main : -n 1 offload-mpi-proxy`, the same two processes for both.
//!
//! - **Bandwidth**, 4 KiB to 256 MiB, both ways: a synchronous copy to (from) the remote host
//!   device `mpi:1/host:0` through the runtime and the mpi plugin, against a plain
//!   `MPI_Send` of the same bytes to the proxy's rank answered by an empty message (the
//!   other way: a count answered by that many bytes), which the proxy serves as plain MPI
//!   (`TAG_ECHO_PUT`, `TAG_ECHO_GET`). Both sides receive into memory they reuse.
//! - **Round trip**: a synchronous launch of an empty kernel on the remote device, against an
//!   MPI ping-pong of 64 bytes and an empty answer.
//!
//!     cargo build --release --workspace && cargo bench -p offload-tests --bench mpi_remote
//!
//! Each figure is timed in rounds, ours and MPI's alternating within a round (both see the same
//! machine); printed: the median over the rounds of the ratio ours/MPI (bandwidth: ours over
//! MPI's, higher is better; round trip: ours over MPI's time, lower is better) and its range.
//! Needs Open MPI's mpirun (scripts/setup.sh installs it). `MPI_REMOTE_ONLY=copies` or
//! `MPI_REMOTE_ONLY=launch` runs one of the two parts (to profile it).

use mpi::point_to_point::{Destination, MatchedReceiveVec, Source};
use mpi::topology::{Communicator, SimpleCommunicator};
use offload::{KernelArg, LaunchDims, Runtime};
use offload_tests::*;
use std::time::Instant;

use offload_mpi::{TAG_ECHO_GET as TAG_GET, TAG_ECHO_PUT as TAG_PUT};
const SIZES: [usize; 6] = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20];
const ROUNDS: usize = 5;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--main") {
        bench(&args[i + 1]);
    } else {
        drive();
    }
}

/// Starts the job and passes its output on.
fn drive() {
    let dir = build_dir();
    let proxy = dir.join("offload-mpi-proxy");
    assert!(
        proxy.exists() && dir.join("liboffload_plugin_mpi.so").exists(),
        "{} has no offload-mpi-proxy or mpi plugin: cargo build --release --workspace",
        dir.display()
    );
    let me = std::env::current_exe().unwrap();
    let empty = host_kernel("empty");
    let mpirun = ["/usr/bin/mpirun", "/usr/local/bin/mpirun"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .expect("mpirun (Open MPI, scripts/setup.sh installs it)");
    let status = std::process::Command::new(mpirun)
        .args(["--oversubscribe", "--bind-to", "none", "-n", "1"])
        .arg(&me)
        .arg("--main")
        .arg(&empty)
        .args([":", "-n", "1"])
        .arg(&proxy)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OFFLOAD_PLUGIN_PATH", &dir)
        .status()
        .expect("start mpirun");
    assert!(status.success(), "the benchmark's job failed: {status}");
}

/// The median and the range of `v`.
fn summary(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// Seconds per call of `f`, over `reps` calls (after one to warm up).
fn per_call(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let t = Instant::now();
    for _ in 0..reps {
        f();
    }
    t.elapsed().as_secs_f64() / reps as f64
}

/// Rank 0: the figures.
fn bench(empty: &str) {
    let rt = Runtime::builder().build().expect("runtime");
    let device = rt
        .device("mpi", 0)
        .expect("a remote device (the job's rank 1)");
    let name = device.info().unwrap().name;
    // MPI is the plugin's (it initialised it, and finalises it at exit); the reference uses
    // the same library's world.
    let world = SimpleCommunicator::world();
    let peer = world.process_at_rank(1);
    let largest = *SIZES.last().unwrap();
    let host: Vec<u8> = (0..largest).map(|i| (i * 7) as u8).collect();
    let mut back = vec![0u8; largest];
    let buf = device.alloc::<u8>(largest).unwrap();
    println!(
        "mpi_remote: {name} against plain MPI with the same rank, {ROUNDS} rounds; bandwidth \
         ratio ours/MPI (higher is better), median [min..max]"
    );
    println!(
        "{:>9}  {:>10} {:>10} {:>22}  {:>10} {:>10} {:>22}",
        "bytes", "to GB/s", "MPI GB/s", "to: ours/MPI", "from GB/s", "MPI GB/s", "from: ours/MPI"
    );
    let only = std::env::var("MPI_REMOTE_ONLY").unwrap_or_default();
    for n in SIZES.into_iter().filter(|_| only != "launch") {
        let reps = ((1usize << 30) / n).clamp(4, 2000);
        let (mut to, mut from) = (Vec::new(), Vec::new());
        let (mut ours_to, mut mpi_to, mut ours_from, mut mpi_from) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let view = buf.slice(..n).unwrap();
        for _ in 0..ROUNDS {
            let a = per_call(reps, || view.write(&host[..n]).unwrap());
            let b = per_call(reps, || {
                peer.send_with_tag(&host[..n], TAG_PUT);
                let _ = peer
                    .matched_probe_with_tag(TAG_PUT)
                    .matched_receive_vec::<u8>();
            });
            let c = per_call(reps, || view.read(&mut back[..n]).unwrap());
            let d = per_call(reps, || {
                peer.send_with_tag(&[n as u64][..], TAG_GET);
                let (message, _) = peer.matched_probe_with_tag(TAG_GET);
                message.matched_receive_into(&mut back[..n]);
            });
            to.push(b / a);
            from.push(d / c);
            let gbs = |t: f64| n as f64 / t / 1e9;
            ours_to.push(gbs(a));
            mpi_to.push(gbs(b));
            ours_from.push(gbs(c));
            mpi_from.push(gbs(d));
        }
        assert_eq!(back[..n], host[..n], "the copies' bytes ({n})");
        let (t, t0, t1) = summary(to);
        let (f, f0, f1) = summary(from);
        println!(
            "{n:>9}  {:>10.2} {:>10.2} {:>22}  {:>10.2} {:>10.2} {:>22}",
            summary(ours_to).0,
            summary(mpi_to).0,
            format!("{t:.2} [{t0:.2}..{t1:.2}]"),
            summary(ours_from).0,
            summary(mpi_from).0,
            format!("{f:.2} [{f0:.2}..{f1:.2}]"),
        );
    }
    if only == "copies" {
        return;
    }
    // Round trips: an empty kernel's synchronous launch against a 64-byte ping-pong.
    let image = std::fs::read(empty).unwrap();
    let program = load(&device, &image).unwrap();
    let kernel = program.kernel("empty").unwrap();
    let dims = LaunchDims::linear(1, 1);
    let args: [KernelArg; 0] = [];
    let ping = [0u8; 64];
    let (mut ratio, mut ours, mut theirs) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        // SAFETY: `empty` takes no argument and touches no memory.
        let a = per_call(2000, || unsafe {
            kernel
                .launch(dims)
                .args_raw(&args)
                .unchecked()
                .run()
                .unwrap()
        });
        let b = per_call(2000, || {
            peer.send_with_tag(&ping[..], TAG_PUT);
            let _ = peer
                .matched_probe_with_tag(TAG_PUT)
                .matched_receive_vec::<u8>();
        });
        ratio.push(a / b);
        ours.push(a * 1e6);
        theirs.push(b * 1e6);
    }
    let (r, r0, r1) = summary(ratio);
    println!(
        "round trip: empty remote launch {:.1} us, MPI ping-pong (64 B) {:.1} us: ours/MPI \
         {r:.2} [{r0:.2}..{r1:.2}] (lower is better)",
        summary(ours).0,
        summary(theirs).0
    );
}
