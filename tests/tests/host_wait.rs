//! How the host backend's idle workers wait (`OFFLOAD_HOST_WAIT`, `OFFLOAD_HOST_SPIN_US`): once
//! a process has launched work and does nothing, its workers go to sleep (blocked in the
//! kernel: they burn no CPU) after the spin time, unless it asked for `spin`, where they never
//! block; every policy gives the same results. The state is read from `/proc` (each worker
//! thread is named `offload-host-N`), not inferred from timings. Each case is a child process
//! (the pool is made once per process), this test binary run again with `OFFLOAD_WAIT_CHILD`.

use offload::{KernelArg, LaunchDims};
use offload_tests::*;
use std::process::Command;
use std::time::Duration;

/// The host pool's worker threads (`/proc/self/task/<tid>`, named `offload-host-N`).
fn workers() -> Vec<std::path::PathBuf> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .map(|t| t.path())
        .filter(|t| {
            std::fs::read_to_string(t.join("comm"))
                .unwrap_or_default()
                .starts_with("offload-host-")
        })
        .collect()
}

/// How many times each worker has blocked and been woken (`voluntary_ctxt_switches`).
fn wakeups() -> Vec<u64> {
    workers()
        .iter()
        .map(|t| {
            std::fs::read_to_string(t.join("status"))
                .unwrap_or_default()
                .lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                .and_then(|v| v.trim().parse().ok())
                .expect("voluntary_ctxt_switches in /proc/<tid>/status")
        })
        .collect()
}

/// The scheduler states (`/proc/self/task/*/stat`, field 3) of the host pool's workers.
fn worker_states() -> Vec<char> {
    workers()
        .iter()
        .filter_map(|t| {
            let stat = std::fs::read_to_string(t.join("stat")).ok()?;
            // "pid (comm) S ...": the state follows the last ')'.
            let (_, rest) = stat.rsplit_once(')')?;
            rest.trim_start().chars().next()
        })
        .collect()
}

/// The child: 50 saxpy launches over 2 threads, checked; then, for `spin`, 200 looks at the
/// workers' states, printing how many found one asleep; for the others, looks until every
/// worker is asleep (at most 20 s), printing whether they all were.
fn child() {
    let rt = host_runtime();
    let device = rt.device("host", 0).unwrap();
    let program =
        offload_tests::load(&device, &std::fs::read(host_kernel("saxpy")).unwrap()).unwrap();
    let kernel = program.kernel("saxpy").unwrap();
    let n = 1usize << 18;
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let bytes = |v: &[f32]| v.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>();
    let (dx, dy) = (
        device.alloc_buffer(n as u64 * 4).unwrap(),
        device.alloc_buffer(n as u64 * 4).unwrap(),
    );
    dx.write(&bytes(&x)).unwrap();
    dy.write(&bytes(&vec![0.0; n])).unwrap();
    let dims = LaunchDims {
        grid: [(n / 256) as u32, 1, 1],
        block: [256, 1, 1],
        shared_mem_bytes: 0,
    };
    let args = [
        KernelArg::I32(n as i32),
        KernelArg::F32(1.0),
        KernelArg::Ptr(dx.ptr()),
        KernelArg::Ptr(dy.ptr()),
    ];
    for _ in 0..50 {
        // SAFETY: both buffers hold n floats, the kernel's extent.
        unsafe { kernel.launch(dims).args_raw(&args).unchecked().run() }.unwrap();
    }
    let mut out = vec![0u8; n * 4];
    dy.read(&mut out).unwrap();
    let want = bytes(&x.iter().map(|v| v * 50.0).collect::<Vec<f32>>());
    assert!(out == want, "saxpy gave wrong results");
    let spin = std::env::var("OFFLOAD_HOST_WAIT").as_deref() == Ok("spin");
    let workers = worker_states().len();
    println!("workers {workers}");
    if spin {
        let asleep = (0..200)
            .filter(|_| {
                std::thread::yield_now();
                worker_states().iter().any(|s| *s == 'S' || *s == 'D')
            })
            .count();
        println!("asleep in {asleep} of 200 looks");
    } else {
        // Polled, with a generous bound: the workers block once their spin time is over.
        let all = (0..20_000).any(|_| {
            let states = worker_states();
            if !states.is_empty() && states.iter().all(|s| *s == 'S') {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
            false
        });
        println!("all asleep {all}");
        // And they stay asleep: no worker wakes while nothing is launched (a worker that woke
        // to poll again would count a switch each time it blocked again).
        let before = wakeups();
        std::thread::sleep(Duration::from_millis(200));
        let after = wakeups();
        let woke: u64 = before.iter().zip(&after).map(|(b, a)| a - b).sum();
        println!("woke {woke} times while idle");
    }
}

/// What the child printed, with the waiting environment `env`.
fn child_says(env: &[(&str, &str)]) -> String {
    let o = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "idle_workers_sleep_unless_asked_to_spin",
            "--nocapture",
        ])
        .env("OFFLOAD_WAIT_CHILD", "1")
        .env("OFFLOAD_HOST_THREADS", "2")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        o.status.success(),
        "{env:?}: {text}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("workers ") && l != "workers 0"),
        "{env:?}: no worker thread found: {text}"
    );
    text
}

#[test]
fn idle_workers_sleep_unless_asked_to_spin() {
    if std::env::var_os("OFFLOAD_WAIT_CHILD").is_some() {
        return child();
    }
    // The default (auto, 2 ms of polling), park, and auto with 100 us: every worker blocks.
    for env in [
        &[][..],
        &[("OFFLOAD_HOST_WAIT", "park")][..],
        &[
            ("OFFLOAD_HOST_WAIT", "auto"),
            ("OFFLOAD_HOST_SPIN_US", "100"),
        ][..],
    ] {
        let text = child_says(env);
        assert!(
            text.contains("all asleep true") && text.contains("woke 0 times while idle"),
            "{env:?}: {text}"
        );
    }
    // spin: the workers poll all along and never block.
    let text = child_says(&[("OFFLOAD_HOST_WAIT", "spin")]);
    assert!(text.contains("asleep in 0 of 200 looks"), "spin: {text}");
    // A bad value is refused by name, not ignored.
    let o = offload(
        &["info"],
        &[("OFFLOAD_HOST_WAIT", "often"), ("OFFLOAD_PLUGINS", "host")],
    );
    let all = format!("{}{}", stdout(&o), stderr(&o));
    assert!(all.contains("OFFLOAD_HOST_WAIT='often'"), "{all}");
}
