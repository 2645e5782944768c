//! How the host backend's idle workers wait (`OFFLOAD_HOST_WAIT`, `OFFLOAD_HOST_SPIN_US`): a
//! process that launched work and then does nothing burns no CPU after the spin time, unless
//! it asked for `spin`; every policy gives the same results. Each case is a child process
//! (the pool is made once per process), this test binary run again with `OFFLOAD_WAIT_CHILD`.

use offload::{KernelArg, LaunchDims};
use offload_tests::*;
use std::process::Command;
use std::time::Duration;

fn cpu_seconds() -> f64 {
    // SAFETY: rusage is plain integers, for which all zeroes is a value.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a live out-pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 * 1e-6;
    t(u.ru_utime) + t(u.ru_stime)
}

/// The child: 50 saxpy launches over 2 threads, checked, then half a second of doing nothing;
/// prints the CPU time the process used meanwhile.
fn child() {
    let rt = host_runtime();
    let device = rt.device("host", 0).unwrap();
    let program = device
        .load(&std::fs::read(host_kernel("saxpy")).unwrap())
        .unwrap();
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
        unsafe { program.launch(&kernel, &dims, &args) }.unwrap();
    }
    let mut out = vec![0u8; n * 4];
    dy.read(&mut out).unwrap();
    let want = bytes(&x.iter().map(|v| v * 50.0).collect::<Vec<f32>>());
    assert!(out == want, "saxpy gave wrong results");
    let before = cpu_seconds();
    std::thread::sleep(Duration::from_millis(500));
    println!("idle cpu ms {:.1}", (cpu_seconds() - before) * 1e3);
}

/// CPU milliseconds of an idle half second after launches, with the waiting environment `env`.
fn idle_cpu_ms(env: &[(&str, &str)]) -> f64 {
    let o = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "idle_workers_burn_no_cpu_unless_asked_to_spin",
            "--nocapture",
        ])
        .env("OFFLOAD_WAIT_CHILD", "1")
        .env("OFFLOAD_HOST_THREADS", "2")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{env:?}: {text}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    text.lines()
        .find_map(|l| l.strip_prefix("idle cpu ms "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{env:?}: no measurement in: {text}"))
}

#[test]
fn idle_workers_burn_no_cpu_unless_asked_to_spin() {
    if std::env::var_os("OFFLOAD_WAIT_CHILD").is_some() {
        return child();
    }
    // The default (auto, 2 ms of polling) and park: asleep for nearly all of the half second.
    for env in [
        &[][..],
        &[("OFFLOAD_HOST_WAIT", "park")][..],
        &[
            ("OFFLOAD_HOST_WAIT", "auto"),
            ("OFFLOAD_HOST_SPIN_US", "100"),
        ][..],
    ] {
        let ms = idle_cpu_ms(env);
        assert!(ms < 40.0, "{env:?}: {ms} ms of CPU in an idle half second");
    }
    // spin: the worker polls all along (a whole core where the machine has one free; at least
    // a share of one on a busy machine).
    let ms = idle_cpu_ms(&[("OFFLOAD_HOST_WAIT", "spin")]);
    assert!(
        ms > 60.0,
        "spin: only {ms} ms of CPU in an idle half second"
    );
    // A bad value is refused by name, not ignored.
    let o = offload(
        &["info"],
        &[("OFFLOAD_HOST_WAIT", "often"), ("OFFLOAD_PLUGINS", "host")],
    );
    let all = format!("{}{}", stdout(&o), stderr(&o));
    assert!(all.contains("OFFLOAD_HOST_WAIT='often'"), "{all}");
}
