//! Remote devices over MPI, on one machine: jobs under Open MPI's `mpirun` whose rank 0 is a
//! program (the raw checker `offload-mpi-check`, the Rust example `mpi_saxpy`, the `offload`
//! command, an OpenMP program) and whose other ranks are `offload-mpi-proxy`, each serving
//! this machine's host device (crates/offload-mpi, crates/plugin-mpi). Needs `mpirun`
//! (scripts/setup.sh installs Open MPI): without it each test fails, naming it.

use offload_tests::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn mpirun_bin() -> &'static str {
    ["/usr/bin/mpirun", "/usr/local/bin/mpirun"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("mpirun (Open MPI's openmpi-bin, which scripts/setup.sh installs) is not installed")
}

fn bin(name: &str) -> PathBuf {
    let b = build_dir().join(name);
    assert!(
        b.exists(),
        "{} is missing: cargo build --workspace",
        b.display()
    );
    b
}

/// Runs `command` (mpirun and its arguments, or a script) as root too, with this build's
/// plugins, the client's timeout `OFFLOAD_MPI_TIMEOUT` and `envs`, killed after `limit` (a
/// hang fails the test); its output and whether it succeeded.
fn job(command: &[&str], envs: &[(&str, &str)], limit: Duration) -> (String, bool) {
    let out = scratch("mpi").join(format!(
        "job-{}-{:?}.log",
        std::process::id(),
        std::thread::current().id()
    ));
    let log = std::fs::File::create(&out).unwrap();
    let mut cmd = Command::new(command[0]);
    cmd.args(&command[1..])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OFFLOAD_PLUGIN_PATH", host_plugin_dir())
        .env_remove("OFFLOAD_PLUGINS")
        .env_remove("OFFLOAD_MPI_PROXY_KILL_AT")
        .env_remove("OFFLOAD_MPI_PROXY_VERSION")
        .env("OFFLOAD_MPI_TIMEOUT", "60");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start the job");
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

/// `mpirun --oversubscribe [flags] -n 1 program args : -n proxies offload-mpi-proxy`.
fn with_proxies(
    flags: &[&str],
    program: &[&str],
    proxies: usize,
    envs: &[(&str, &str)],
) -> (String, bool) {
    let proxy = bin("offload-mpi-proxy");
    let n = proxies.to_string();
    let mut command = vec![mpirun_bin(), "--oversubscribe", "--bind-to", "none"];
    command.extend(flags);
    command.extend(["-n", "1"]);
    command.extend(program);
    command.extend([":", "-n", &n, proxy.to_str().unwrap()]);
    job(&command, envs, Duration::from_secs(120))
}

#[test]
fn a_job_copies_to_each_proxy_byte_for_byte_and_proxies_refuse_bad_requests() {
    let check = bin("offload-mpi-check");
    let (text, ok) = with_proxies(&[], &[check.to_str().unwrap()], 2, &[]);
    assert!(ok, "{text}");
    assert!(text.contains("mpi-check: ok, 2 proxies"), "{text}");
    for rank in [1, 2] {
        assert!(
            text.contains(&format!("mpi-check: mpi:{rank}/host:0 ")),
            "{text}"
        );
        for len in [0, 1, 7, 4096, (1 << 20) + 3, 64 << 20] {
            let line = format!("mpi-check: rank {rank} copy {len} bytes there and back: ok");
            assert!(text.contains(&line), "{line}\n{text}");
        }
        for refused in [
            "copy from the device",
            "copy to the device",
            "free",
            "alloc",
            "kernel lookup",
            "queue synchronize",
            "a corrupted message",
        ] {
            let line = format!("mpi-check: rank {rank} refuses {refused}");
            assert!(text.contains(&line), "{line}\n{text}");
        }
        for line in [
            format!("mpi-check: rank {rank} reports queued work's error at sync"),
            format!("mpi-check: rank {rank} refuses a write stream past an allocation"),
            format!("mpi-check: rank {rank} refuses a read stream past an allocation"),
            format!(
                "mpi-check: rank {rank} streams of 1048581 bytes there and back, refused past \
                 the end: ok"
            ),
            format!("mpi-check: rank {rank} shut down"),
        ] {
            assert!(text.contains(&line), "{line}\n{text}");
        }
    }
}

#[test]
fn a_proxy_whose_read_stream_nobody_takes_ends_instead_of_leaving_device_memory_to_mpi() {
    // The proxy sends a host device's read stream straight from device memory: a chunk the
    // program never takes may still be read by MPI later, so the proxy ends (and, without
    // --enable-recovery, the job with it) within the timeout, saying why.
    let check = bin("offload-mpi-check");
    let (text, ok) = with_proxies(
        &[],
        &[check.to_str().unwrap(), "--stall-read"],
        1,
        &[("OFFLOAD_MPI_TIMEOUT", "2")],
    );
    assert!(!ok, "{text}");
    assert!(
        text.contains("asked for a read stream; taking none of it"),
        "{text}"
    );
    assert!(
        text.contains(
            "the program took no chunk of a read stream in 2s (OFFLOAD_MPI_TIMEOUT); the proxy ends"
        ),
        "{text}"
    );
    assert!(!text.contains("was still in the job"), "{text}");
}

#[test]
fn a_rank_that_is_no_proxy_is_named_instead_of_waited_for() {
    // Two ranks of the check: neither says hello, so each names the other within the
    // timeout (3 s here) instead of hanging.
    let check = bin("offload-mpi-check");
    let (text, ok) = job(
        &[
            mpirun_bin(),
            "--oversubscribe",
            "-n",
            "2",
            check.to_str().unwrap(),
        ],
        &[("OFFLOAD_MPI_TIMEOUT", "3")],
        Duration::from_secs(120),
    );
    assert!(!ok, "{text}");
    assert!(
        text.contains("sent no proxy hello in 3s") && text.contains("offload-mpi-proxy"),
        "{text}"
    );
}

#[test]
fn a_rust_program_runs_saxpy_on_every_remote_device_native_and_jit() {
    let saxpy = bin("mpi_saxpy");
    let (text, ok) = with_proxies(&[], &[saxpy.to_str().unwrap()], 2, &[]);
    assert!(ok, "{text}");
    for rank in [1, 2] {
        for what in ["native", "bitcode"] {
            let (device, outcome) = (
                format!("mpi_saxpy: mpi:{rank}/host:0 ("),
                format!("): {what} saxpy, sync and on a queue: right"),
            );
            assert!(
                text.lines()
                    .any(|l| l.starts_with(&device) && l.ends_with(&outcome)),
                "mpi:{rank} {what}\n{text}"
            );
        }
    }
}

#[test]
fn offload_info_lists_the_remote_devices_in_a_job_and_says_why_there_are_none_outside() {
    // Outside a job: no device, the reason, and no MPI started (nothing waits for a launcher).
    let mut cmd = Command::new(offload_bin());
    cmd.arg("info")
        .env("OFFLOAD_PLUGIN_PATH", host_plugin_dir())
        .env_remove("OFFLOAD_PLUGINS");
    for v in ["OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMIX_RANK"] {
        cmd.env_remove(v);
    }
    let o = cmd.output().unwrap();
    let text = stdout(&o);
    assert!(o.status.success(), "{text}{}", stderr(&o));
    let line = text
        .lines()
        .position(|l| l.starts_with("plugin mpi"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        text.lines().nth(line).unwrap().contains("no-devices"),
        "{text}"
    );
    assert!(
        text.contains("reason: no device: not in an MPI job (none of OMPI_COMM_WORLD_SIZE"),
        "{text}"
    );
    // In a job: each proxy and its device, by address.
    let offload = offload_bin();
    let (text, ok) = with_proxies(&[], &[offload.to_str().unwrap(), "info"], 2, &[]);
    assert!(ok, "{text}");
    for rank in [1, 2] {
        assert!(
            text.contains(&format!(
                "rank {rank}: offload-mpi-proxy, 1 device(s): mpi:{rank}/host:0"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!("mpi:{}  mpi:{rank}/host:0 (", rank - 1)),
            "{text}"
        );
    }
}

#[test]
fn a_proxy_refuses_an_image_its_node_cannot_run_naming_why() {
    // A CUDA image for a node whose only device is the host: the load is refused by the
    // proxy's device, with its reason, and the program ends cleanly.
    let image = scratch("mpi").join("cuda.elf");
    std::fs::write(&image, synthetic_elf(190, &["k"])).unwrap();
    let offload = offload_bin();
    let (text, ok) = with_proxies(
        &[],
        &[
            offload.to_str().unwrap(),
            "run",
            // The remote device by its address (mpi:0 is the same device).
            "--device",
            "mpi:1/host:0",
            "--kernel",
            "k",
            image.to_str().unwrap(),
        ],
        1,
        &[],
    );
    assert!(!ok, "{text}");
    assert!(
        text.contains("mpi:1/host:0: proxy rank 1, image") && text.contains("EM_CUDA"),
        "{text}"
    );
}

#[test]
fn a_proxy_of_another_version_is_refused_at_start_with_both_versions() {
    let offload = offload_bin();
    let (text, ok) = with_proxies(
        &[],
        &[offload.to_str().unwrap(), "info"],
        1,
        &[("OFFLOAD_MPI_PROXY_VERSION", "99")],
    );
    assert!(ok, "{text}");
    assert!(
        text.contains(&format!(
            "rank 1 is an offload-mpi-proxy speaking message version 99; this program's mpi \
             plugin speaks version {}",
            offload_mpi::wire::VERSION
        )),
        "{text}"
    );
}

#[test]
fn openmp_target_regions_run_on_a_remote_host_device_aot_and_jit() {
    // tests/omp/smoke.c: maps, data regions, enter/exit data, globals, pointer attachment,
    // omp_target_alloc and memcpy; tests/omp/gpu_nowait.c: `nowait` regions and data
    // constructs ordered by `depend` (it computes on a host device too).
    let lib = omptarget_dir();
    for (source, says) in [
        ("smoke.c", "PASSED"),
        ("gpu_nowait.c", "nowait done devices 1 PASSED"),
    ] {
        let src = repo_root().join("tests/omp").join(source);
        for (tag, extra) in [("aot", vec![]), ("jit", vec!["-fopenmp-target-jit"])] {
            let program = scratch("mpi").join(format!("{source}-{tag}"));
            omp_program(&src, &program, &lib, extra.as_slice());
            // Only the remote device is visible to the program (OFFLOAD_PLUGINS=mpi for it).
            let script = repo_root().join("scripts/mpi-remote");
            let (text, ok) = job(
                &[script.to_str().unwrap(), program.to_str().unwrap()],
                &[("OMP_TARGET_OFFLOAD", "MANDATORY")],
                Duration::from_secs(300),
            );
            assert!(ok, "{source} {tag}: {text}");
            assert!(text.contains(says), "{source} {tag}: {text}");
            assert!(!text.contains("FAIL "), "{source} {tag}: {text}");
            if source == "smoke.c" {
                assert!(
                    text.contains("devices 1") && text.contains("ok offloaded"),
                    "{tag}: {text}"
                );
            }
        }
    }
}

#[test]
fn what_remote_target_regions_print_comes_between_the_programs_lines_in_order() {
    // tests/omp/printing.c: a region's printf is the proxy's output; the proxy sends it before
    // each reply and the program prints it then, so the lines are in the program's order (by
    // default mpirun would merge two processes' output in no fixed order).
    let lib = omptarget_dir();
    let src = repo_root().join("tests/omp/printing.c");
    let mut expected: Vec<String> = Vec::new();
    for i in 0..30 {
        expected.push(format!("host {i}"));
        expected.push(format!("region {i}"));
    }
    expected.extend((0..40000).map(|j| {
        format!("burst {j:05} .............................................................")
    }));
    for l in [
        "host after burst",
        "nowait region",
        "host after taskwait",
        "partial line",
        "host end, 30 of 30 regions on a device",
    ] {
        expected.push(l.to_string());
    }
    for (tag, extra) in [("aot", vec![]), ("jit", vec!["-fopenmp-target-jit"])] {
        let program = scratch("mpi").join(format!("printing-{tag}"));
        omp_program(&src, &program, &lib, extra.as_slice());
        let script = repo_root().join("scripts/mpi-remote");
        let (text, ok) = job(
            &[script.to_str().unwrap(), program.to_str().unwrap()],
            &[("OMP_TARGET_OFFLOAD", "MANDATORY")],
            Duration::from_secs(300),
        );
        assert!(ok, "{tag}: {text}");
        // Each thread's lines in its order (the two threads' lines interleave as they may).
        for t in 0..2 {
            let mine: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with(&format!("thread {t} ")))
                .collect();
            let want: Vec<String> = (0..20)
                .flat_map(|k| {
                    [
                        format!("thread {t} region {k}"),
                        format!("thread {t} after region {k}"),
                    ]
                })
                .collect();
            assert_eq!(mine, want, "{tag}: thread {t}'s lines");
        }
        // The job's log has stderr too (mpirun's and the ranks'): the program's lines only.
        let got: Vec<&str> = text
            .lines()
            .filter(|l| {
                ["host ", "region ", "burst ", "nowait ", "partial"]
                    .iter()
                    .any(|p| l.starts_with(p))
            })
            .collect();
        if let Some(k) = (0..expected.len().max(got.len()))
            .find(|&k| got.get(k).copied() != expected.get(k).map(String::as_str))
        {
            panic!(
                "{tag}: line {k} of the program's output is {:?}, expected {:?} ({} lines, \
                 expected {})",
                got.get(k),
                expected.get(k),
                got.len(),
                expected.len()
            );
        }
    }
}

#[test]
fn a_proxy_killed_mid_launch_or_mid_copy_fails_its_device_in_bounded_time_and_the_other_works() {
    // `--enable-recovery` keeps the job alive when a rank dies, so the program meets the dead
    // proxy itself: the operation in flight fails within OFFLOAD_MPI_TIMEOUT naming the rank
    // and the operation, the device refuses work afterwards, the other proxy's device works.
    let saxpy = bin("mpi_saxpy");
    for op in ["launch", "copy to the device"] {
        let kill = format!("1:{op}");
        let start = Instant::now();
        let (text, _) = with_proxies(
            &["--enable-recovery"],
            &[saxpy.to_str().unwrap()],
            2,
            &[
                ("OFFLOAD_MPI_TIMEOUT", "3"),
                ("OFFLOAD_MPI_PROXY_KILL_AT", &kill),
            ],
        );
        let took = start.elapsed();
        let failed = format!("mpi:1/host:0: proxy rank 1 did not answer {op} in 3s");
        assert!(
            text.lines()
                .any(|l| l.contains("native saxpy") && l.contains(&failed)),
            "{op}: {failed}\n{text}"
        );
        assert!(
            text.contains("mpi:1/host:0: proxy rank 1 failed earlier and takes no more work"),
            "{op}: {text}"
        );
        for what in ["native", "bitcode"] {
            assert!(
                text.lines().any(|l| l.contains("mpi:2/host:0")
                    && l.contains(&format!("{what} saxpy, sync and on a queue: right"))),
                "{op}: mpi:2 {what}\n{text}"
            );
        }
        // Bounded: one timeout for the operation in flight, none for later ones.
        assert!(took < Duration::from_secs(60), "{op}: {took:?}\n{text}");
    }
}

#[test]
fn without_recovery_mpirun_ends_the_whole_job_when_a_proxy_dies() {
    // Open MPI's default: a rank killed by a signal aborts the job, naming the rank.
    let saxpy = bin("mpi_saxpy");
    let (text, ok) = with_proxies(
        &[],
        &[saxpy.to_str().unwrap()],
        2,
        &[("OFFLOAD_MPI_PROXY_KILL_AT", "1:launch")],
    );
    assert!(!ok, "{text}");
    assert!(
        text.contains("process rank 1") && text.contains("signal 9"),
        "{text}"
    );
    assert!(
        !text.contains("saxpy, sync and on a queue: right\nmpi_saxpy: mpi:1"),
        "{text}"
    );
}

#[test]
fn remote_copies_of_0_bytes_to_64_mib_queues_events_and_threads_are_byte_for_byte() {
    let copies = bin("mpi-copies");
    let (text, ok) = with_proxies(&[], &[copies.to_str().unwrap()], 2, &[]);
    assert!(ok, "{text}");
    assert!(text.contains("mpi-copies: ok, 2 devices"), "{text}");
    for rank in [1, 2] {
        let at = format!("mpi:{rank}/host:0");
        for len in [
            1,
            7,
            4096,
            (256 << 10) - 1,
            256 << 10,
            (1 << 20) + 3,
            (64 << 20) + 5,
        ] {
            let line = format!("mpi-copies: {at}: {len} bytes there, back and across: ok");
            assert!(text.contains(&line), "{line}\n{text}");
        }
        for what in [
            "a queued read completed by an event: ok",
            "four threads, each with its own queue: ok",
        ] {
            assert!(
                text.contains(&format!("mpi-copies: {at}: {what}")),
                "{what}\n{text}"
            );
        }
    }
}

#[test]
fn a_kernel_that_runs_longer_than_the_timeout_is_not_a_dead_proxy() {
    // The proxy says it is busy while it serves a request: a 4.5 s kernel with a 2 s
    // timeout, synchronous and on a queue, completes.
    let nap = host_so(
        "mpi-nap",
        "#include \"offload_kernel.h\"\n#include <time.h>\n\
         OFFLOAD_KERNEL void nap(int ms) {\n\
           struct timespec t = { ms / 1000, (ms % 1000) * 1000000L };\n\
           while (nanosleep(&t, &t) != 0) {}\n\
         }\n\
         OFFLOAD_SIGNATURE(nap, int);\n",
    );
    let copies = bin("mpi-copies");
    let (text, ok) = with_proxies(
        &[],
        &[
            copies.to_str().unwrap(),
            "--nap",
            nap.to_str().unwrap(),
            "4500",
        ],
        1,
        &[("OFFLOAD_MPI_TIMEOUT", "2")],
    );
    assert!(ok, "{text}");
    assert!(
        text.contains("mpi-copies: mpi:1/host:0: a 4500 ms kernel, synchronous (")
            && text.contains(": ok"),
        "{text}"
    );
}
