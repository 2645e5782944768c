//! Remote devices over MPI, on one machine: a job under Open MPI's `mpirun` whose rank 0 is
//! `offload-mpi-check` and whose other ranks are `offload-mpi-proxy`, each serving this
//! machine's host device (crates/offload-mpi). Needs `mpirun` (scripts/setup.sh installs
//! Open MPI): without it the test fails, naming it.

use offload_tests::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `mpirun` with `args` (as root too, oversubscribing the machine's cores), with the
/// client's timeout `OFFLOAD_MPI_TIMEOUT` seconds, killed after `limit`; its output and
/// whether it succeeded.
fn mpirun(args: &[&str], timeout: &str, limit: Duration) -> (String, bool) {
    let mpirun = ["/usr/bin/mpirun", "/usr/local/bin/mpirun"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .expect(
            "mpirun (Open MPI's openmpi-bin, which scripts/setup.sh installs) is not installed",
        );
    let out = scratch("mpi").join("job.log");
    let log = std::fs::File::create(&out).unwrap();
    let mut child = Command::new(mpirun)
        .arg("--oversubscribe")
        .args(args)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OFFLOAD_PLUGIN_PATH", host_plugin_dir())
        .env("OFFLOAD_PLUGINS", "host")
        .env("OFFLOAD_MPI_TIMEOUT", timeout)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start mpirun");
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = std::fs::read_to_string(&out).unwrap();
    match status {
        None => panic!("the job did not end in {limit:?}:\n{text}"),
        Some(s) => (text, s.success()),
    }
}

#[test]
fn a_job_copies_to_each_proxy_byte_for_byte_and_proxies_refuse_bad_requests() {
    let check = build_dir().join("offload-mpi-check");
    let proxy = build_dir().join("offload-mpi-proxy");
    for b in [&check, &proxy] {
        assert!(
            b.exists(),
            "{} is missing: cargo build --workspace",
            b.display()
        );
    }
    let (text, ok) = mpirun(
        &[
            "-n",
            "1",
            check.to_str().unwrap(),
            ":",
            "-n",
            "2",
            proxy.to_str().unwrap(),
        ],
        "60",
        Duration::from_secs(300),
    );
    assert!(ok, "{text}");
    assert!(text.contains("mpi-check: ok, 2 proxies"), "{text}");
    for rank in [1, 2] {
        assert!(
            text.contains(&format!("mpi-check: rank {rank} device 0: host:0")),
            "{text}"
        );
        for len in [0, 1, 7, 4096, (1 << 20) + 3, 64 << 20] {
            let line = format!("mpi-check: rank {rank} copy {len} bytes there and back: ok");
            assert!(text.contains(&line), "{line}\n{text}");
        }
        for refused in ["read", "write", "free", "alloc", "a corrupted message"] {
            let line = format!("mpi-check: rank {rank} refuses {refused}");
            assert!(text.contains(&line), "{line}\n{text}");
        }
        assert!(
            text.contains(&format!("mpi-check: rank {rank} shut down")),
            "{text}"
        );
    }
}

#[test]
fn a_rank_that_is_no_proxy_is_named_instead_of_waited_for() {
    // Two ranks of the check: neither says hello, so each names the other within the
    // timeout (3 s here) instead of hanging.
    let check = build_dir().join("offload-mpi-check");
    let (text, ok) = mpirun(
        &["-n", "2", check.to_str().unwrap()],
        "3",
        Duration::from_secs(120),
    );
    assert!(!ok, "{text}");
    assert!(
        text.contains("sent no proxy hello in 3s") && text.contains("offload-mpi-proxy"),
        "{text}"
    );
}
