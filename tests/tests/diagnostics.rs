//! Diagnostics: the info log (`OFFLOAD_INFO`, alias `LIBOMPTARGET_INFO`), the debug log
//! (`OFFLOAD_DEBUG`), the profile (`OFFLOAD_PROFILE`, `offload run --profile`) and the progress
//! line on a terminal.

use offload_tests::*;
use serde_json::Value;
use std::path::PathBuf;

fn run(args: &[String], env: &[(&str, &str)]) -> std::process::Output {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    offload(&a, env)
}

#[test]
fn the_info_log_shows_routing_the_jit_copies_and_the_launch() {
    let image = host_bitcode("variant_b");
    let o = run(&which_run_args(&image), &[("OFFLOAD_INFO", "all")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    for line in err.lines() {
        assert!(
            line.starts_with("offload: info: "),
            "not an info line: {line}"
        );
    }
    for want in [
        "offload: info: plugin: plugin 'host' loaded",
        "offload: info: image: classified as LLVM bitcode",
        "routed to host:0",
        "offload: info: jit: JIT worker started",
        "compiled in",
        "offload: info: memory: allocated 256 bytes",
        "offload: info: copy: 256 bytes host -> device",
        "offload: info: copy: 256 bytes device",
        "offload: info: launch: kernel 'which' on host:0, grid 2x1x1, block 32x1x1",
        "arguments [Ptr(",
    ] {
        assert!(err.contains(want), "no '{want}' in:\n{err}");
    }
    // Upstream's name and bits: 0x10 is launches only (no arguments without 0x01).
    let o = run(&which_run_args(&image), &[("LIBOMPTARGET_INFO", "0x10")]);
    let err = stderr(&o);
    assert!(err.contains("launch: kernel 'which'"), "{err}");
    assert!(
        !err.contains("copy:") && !err.contains("arguments"),
        "{err}"
    );
    // A list of kind names and bits.
    let o = run(&which_run_args(&image), &[("OFFLOAD_INFO", "copy, 0x400")]);
    let err = stderr(&o);
    assert!(err.contains("copy:") && err.contains("jit:"), "{err}");
    assert!(!err.contains("launch:"), "{err}");
    // Off: nothing.
    let o = run(&which_run_args(&image), &[]);
    assert!(stderr(&o).is_empty(), "{}", stderr(&o));
}

#[test]
fn bad_diagnostics_values_are_one_line_errors_naming_the_variable() {
    let image = host_bitcode("variant_b");
    for (var, value) in [
        ("OFFLOAD_INFO", "lots"),
        ("LIBOMPTARGET_INFO", "0xZZ"),
        ("OFFLOAD_INFO", "launch,bogus"),
        ("OFFLOAD_DEBUG", "very"),
        ("LIBOMPTARGET_DEBUG", "-3"),
        ("OFFLOAD_PROFILE", "/no/such/dir/t.json"),
    ] {
        for args in [which_run_args(&image), vec!["info".to_string()]] {
            let o = run(&args, &[(var, value)]);
            assert_eq!(o.status.code(), Some(2), "{var}={value}: {}", stderr(&o));
            let err = stderr(&o);
            assert_eq!(err.lines().count(), 1, "{err}");
            assert!(err.contains(var) && err.contains(value), "{err}");
        }
    }
}

#[test]
fn the_debug_log_shows_every_event_and_the_compile_phases() {
    let image = host_bitcode("variant_a");
    let o = run(&which_run_args(&image), &[("OFFLOAD_DEBUG", "1")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    for want in [
        "offload: debug: [",
        "compile phase parse",
        "compile phase optimize",
        "compile phase codegen",
        "compile phase link",
        "launch: kernel 'which' on host:0",
        "copy: 256 bytes host -> device",
    ] {
        assert!(err.contains(want), "no '{want}' in:\n{err}");
    }
}

/// Complete events of a trace: (pid, tid, name, start µs, duration µs).
fn spans(trace: &Value) -> Vec<(u64, u64, String, f64, f64)> {
    trace["traceEvents"]
        .as_array()
        .expect("traceEvents")
        .iter()
        .filter(|e| e["ph"] == "X")
        .map(|e| {
            (
                e["pid"].as_u64().unwrap(),
                e["tid"].as_u64().unwrap(),
                e["name"].as_str().unwrap().to_string(),
                e["ts"].as_f64().unwrap(),
                e["dur"].as_f64().unwrap(),
            )
        })
        .collect()
}

fn check_nesting(all: &[(u64, u64, String, f64, f64)]) {
    const EPS: f64 = 2.0; // µs of rounding
    for a in all {
        let mut children = 0.0;
        for b in all {
            if std::ptr::eq(a, b) || (a.0, a.1) != (b.0, b.1) {
                continue;
            }
            let (a0, a1, b0, b1) = (a.3, a.3 + a.4, b.3, b.3 + b.4);
            let disjoint = b1 <= a0 + EPS || b0 >= a1 - EPS;
            let inside = b0 >= a0 - EPS && b1 <= a1 + EPS;
            let around = a0 >= b0 - EPS && a1 <= b1 + EPS;
            assert!(
                disjoint || inside || around,
                "spans overlap without nesting: {a:?} and {b:?}"
            );
            // Direct children: inside a, and inside no other span that is inside a.
            if inside && !around {
                let direct = !all.iter().any(|c| {
                    !std::ptr::eq(c, a)
                        && !std::ptr::eq(c, b)
                        && (c.0, c.1) == (a.0, a.1)
                        && c.3 >= a0 - EPS
                        && c.3 + c.4 <= a1 + EPS
                        && b0 >= c.3 - EPS
                        && b1 <= c.3 + c.4 + EPS
                        && c.4 > b.4
                });
                if direct {
                    children += b.4;
                }
            }
        }
        assert!(
            children <= a.4 + 10.0,
            "children of {a:?} add up to {children} µs, more than it"
        );
    }
}

#[test]
fn the_profile_covers_the_runs_timings_and_its_spans_nest() {
    let image = host_bitcode("variant_a");
    let dir = scratch("diag-profile");
    let trace_path = dir.join("t.json");
    let mut args = which_run_args(&image);
    args.extend(["--json", "--profile", trace_path.to_str().unwrap()].map(String::from));
    let o = run(&args, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out: Value = serde_json::from_slice(&o.stdout).unwrap();
    let trace: Value = serde_json::from_str(&std::fs::read_to_string(&trace_path).unwrap())
        .expect("the profile is JSON");
    assert_eq!(trace["displayTimeUnit"], "ms");
    let all = spans(&trace);
    let pid = all
        .iter()
        .find(|s| s.2 == "total")
        .map(|s| s.0)
        .expect("a total span");
    for (key, name) in [
        ("load", "load"),
        ("copy_in", "copy_in"),
        ("launch", "launch"),
        ("copy_out", "copy_out"),
        ("total", "total"),
    ] {
        let want = out["timings_ms"][key].as_f64().unwrap();
        let got = all
            .iter()
            .find(|s| s.0 == pid && s.2 == name)
            .unwrap_or_else(|| panic!("no '{name}' span in {all:?}"))
            .4
            / 1e3;
        assert!(
            (got - want).abs() <= want * 0.05 + 0.05,
            "span '{name}' {got} ms, timings_ms.{key} {want} ms"
        );
    }
    // The JIT's request, its compile and the worker's phases on the worker's own track.
    for name in [
        "jit request",
        "compile",
        "image load",
        "kernel launch",
        "route",
    ] {
        assert!(all.iter().any(|s| s.2 == name), "no '{name}' in {all:?}");
    }
    let worker: Vec<_> = all.iter().filter(|s| s.0 != pid).collect();
    let phases: Vec<&str> = worker.iter().map(|s| s.2.as_str()).collect();
    for p in ["parse", "optimize", "codegen", "link"] {
        assert!(phases.contains(&p), "no worker phase '{p}' in {phases:?}");
    }
    let compile = all.iter().find(|s| s.2 == "compile").unwrap();
    let phase_sum: f64 = worker.iter().map(|s| s.4).sum();
    assert!(
        phase_sum <= compile.4 + 10.0,
        "worker phases {phase_sum} µs > the compile {} µs",
        compile.4
    );
    check_nesting(&all);
    let names: Vec<&Value> = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "M")
        .collect();
    assert!(
        names
            .iter()
            .any(|e| e["args"]["name"] == "offload-jit-worker"),
        "{names:?}"
    );

    // OFFLOAD_PROFILE: the same file, written when the process ends.
    let env_path = dir.join("env.json");
    let o = run(
        &which_run_args(&image),
        &[("OFFLOAD_PROFILE", env_path.to_str().unwrap())],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let trace: Value = serde_json::from_str(&std::fs::read_to_string(&env_path).unwrap()).unwrap();
    check_nesting(&spans(&trace));
    assert!(spans(&trace).iter().any(|s| s.2 == "kernel launch"));
}

/// Runs `offload ARGS` with stderr on a pseudo-terminal; returns what it wrote there.
fn on_a_terminal(args: &[&str]) -> (std::process::ExitStatus, String) {
    use std::io::Read;
    use std::os::fd::FromRawFd;
    let (mut master, mut slave) = (0, 0);
    // SAFETY: two out-parameters; null name, termios and window size are allowed.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty");
    // SAFETY: fresh descriptors from openpty, owned here.
    let (master, slave) = unsafe {
        (
            std::fs::File::from_raw_fd(master),
            std::os::fd::OwnedFd::from_raw_fd(slave),
        )
    };
    let mut child = std::process::Command::new(offload_bin())
        .args(args)
        .env("OFFLOAD_CACHE", "0")
        .env("OFFLOAD_PROGRESS_AFTER_MS", "0")
        .stderr(std::process::Stdio::from(slave))
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        let mut m = master;
        let mut buf = [0u8; 4096];
        // Ends with EIO once the child (the last holder of the slave) exits.
        while let Ok(n) = m.read(&mut buf) {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        out
    });
    let status = child.wait().unwrap();
    let out = reader.join().unwrap();
    (status, String::from_utf8_lossy(&out).into_owned())
}

/// A module whose compile takes a few seconds in the debug build of the worker (150 helper
/// functions with two loops each, called from one kernel).
fn slow_module() -> PathBuf {
    let dir = scratch("diag-progress");
    let c = dir.join("slow.c");
    let bc = dir.join("slow.bc");
    // A compile of a good fraction of a second here (150 functions took 1.3 s on the 2-core
    // VM): the test shows the line from the start (`OFFLOAD_PROGRESS_AFTER_MS=0`, looked for
    // every 10 ms), so a machine many times faster still draws it.
    let n = 150;
    let mut src = String::from("#include \"offload_kernel.h\"\n");
    for i in 0..n {
        src.push_str(&format!(
            "__attribute__((noinline)) static float f{i}(const float *x, int n) {{ float s = 0; \
             for (int j = 0; j < n; ++j) s += x[j] * {a}.0f + (j % {m}); \
             for (int j = 0; j < n; j += 2) s -= x[j] / {b}.0f; return s; }}\n",
            a = i + 1,
            b = i + 2,
            m = i % 7 + 2
        ));
    }
    src.push_str(
        "OFFLOAD_KERNEL void slow(const float *x, float *y, int n) { unsigned i = \
         offload_global_id_x(); float s = 0;\n",
    );
    for i in 0..n {
        src.push_str(&format!("  s += f{i}(x, n);\n"));
    }
    src.push_str("  y[i] = s; }\n");
    std::fs::write(&c, src).unwrap();
    let include = repo_root().join("include");
    clang(&[
        "-O1",
        "-fPIC",
        "-emit-llvm",
        "-c",
        "-I",
        include.to_str().unwrap(),
        c.to_str().unwrap(),
        "-o",
        bc.to_str().unwrap(),
    ]);
    bc
}

#[test]
fn long_compiles_show_a_progress_line_on_a_terminal_only() {
    let bc = slow_module();
    let out = scratch("diag-progress").join("slow.so");
    let args = [
        "jit",
        bc.to_str().unwrap(),
        "--target",
        "x86_64-unknown-linux-gnu",
        "--cpu",
        "x86-64",
        "-o",
        out.to_str().unwrap(),
    ];
    // Shown from the start (OFFLOAD_PROGRESS_AFTER_MS=0, looked for every 10 ms), so the test
    // does not depend on how long the compile takes on this machine.
    let (status, tty) = on_a_terminal(&args);
    assert!(status.success(), "{tty}");
    assert!(tty.contains("compiling"), "no progress line: {tty:?}");
    assert!(tty.contains(" s)"), "no elapsed time: {tty:?}");
    assert!(tty.ends_with("\r\x1b[K"), "the line is not erased: {tty:?}");
    // Not a terminal, or --json: no progress.
    let o = offload(&args, &[("OFFLOAD_CACHE", "0")]);
    assert!(o.status.success());
    assert!(stderr(&o).is_empty(), "{}", stderr(&o));
    let mut json_args = args.to_vec();
    json_args.push("--json");
    let (status, tty) = on_a_terminal(&json_args);
    assert!(status.success());
    assert!(!tty.contains("compiling"), "{tty:?}");
}

/// Random values of the diagnostics variables never crash `offload`: it runs, or stops with
/// one line naming the variable (seeded; `OFFLOAD_TEST_SEED` reruns one).
#[test]
fn random_diagnostics_values_are_accepted_or_named() {
    let seed: u64 = std::env::var("OFFLOAD_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0xd1a9);
    let mut s = seed;
    let mut next = || {
        s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let pieces = [
        "",
        "0",
        "1",
        "-1",
        "all",
        "0x",
        "0x10",
        "0xffffffff",
        "launch",
        "copy",
        ",",
        " ",
        "jit,",
        "4294967296",
        "99999999999999999999",
        "true",
        "off",
        "\u{7f}",
        "é",
        "/tmp",
        "/",
        "/no/dir/x",
        "args,0x20",
    ];
    let vars = [
        "OFFLOAD_INFO",
        "LIBOMPTARGET_INFO",
        "OFFLOAD_DEBUG",
        "LIBOMPTARGET_DEBUG",
        "OFFLOAD_PROFILE",
    ];
    let dir = scratch("diag-fuzz");
    for i in 0..40 {
        let mut cmd = std::process::Command::new(offload_bin());
        cmd.arg("info").current_dir(&dir);
        let mut set = Vec::new();
        for v in vars {
            if next() % 2 == 0 {
                let a = pieces[(next() % pieces.len() as u64) as usize];
                let b = pieces[(next() % pieces.len() as u64) as usize];
                let value = format!("{a}{b}");
                cmd.env(v, &value);
                set.push(format!("{v}={value:?}"));
            }
        }
        let o = cmd.output().unwrap();
        let code = o.status.code();
        assert!(
            matches!(code, Some(0) | Some(1) | Some(2)),
            "seed {seed}, case {i} ({set:?}): {code:?}: {}",
            stderr(&o)
        );
        if code == Some(2) {
            let e = stderr(&o);
            assert_eq!(e.lines().count(), 1, "seed {seed}, case {i}: {e}");
            assert!(vars.iter().any(|v| e.contains(v)), "{set:?}: {e}");
        }
    }
}

/// Operations on queues and events (the device API below the runtime) are traced, each on its
/// queue's own track of the profile.
#[test]
fn queue_operations_go_on_their_queues_tracks() {
    use offload::{KernelArg, LaunchDims};
    let path = scratch("diag-queue").join("q.json");
    offload::diagnostics::init(Some(path.clone())).unwrap();
    let rt = host_runtime();
    let device = rt.device("host", 0).unwrap();
    let program =
        offload_tests::load(&device, &std::fs::read(host_kernel("variant_a")).unwrap()).unwrap();
    let kernel = program.kernel("which").unwrap();
    let buf = device.alloc_buffer(256).unwrap();
    // SAFETY: the device API is used on this test's own allocations only, with no HostBuffer or safe-layer queue on them.
    let raw = unsafe { offload::raw::device(&device) };
    let q = raw.queue_create().unwrap();
    // SAFETY: a test kernel on this test's own allocations, each as long as the kernel touches.
    unsafe {
        raw.launch(
            kernel.handle(),
            &LaunchDims::linear(2, 32),
            &[KernelArg::Ptr(buf.ptr())],
            Some(q),
        )
    }
    .unwrap();
    let ev = raw.event_create().unwrap();
    raw.event_record(ev, q).unwrap();
    raw.event_synchronize(ev).unwrap();
    raw.queue_synchronize(q).unwrap();
    raw.queue_destroy(q).unwrap();
    offload::diagnostics::flush_profile().unwrap();
    let trace: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let track = events
        .iter()
        .find(|e| e["ph"] == "M" && e["args"]["name"] == format!("queue {}", q.0))
        .unwrap_or_else(|| panic!("no track for queue {}: {trace}", q.0))["tid"]
        .as_u64()
        .unwrap();
    for name in [
        "enqueue launch",
        "event_record",
        "queue_synchronize",
        "queue_destroy",
    ] {
        let e = events
            .iter()
            .find(|e| e["ph"] == "X" && e["name"] == name)
            .unwrap_or_else(|| panic!("no '{name}' in {trace}"));
        assert_eq!(e["tid"].as_u64(), Some(track), "{name}: {e}");
    }
    let sync = events
        .iter()
        .find(|e| e["ph"] == "X" && e["name"] == "event_synchronize")
        .unwrap();
    assert_ne!(
        sync["tid"].as_u64(),
        Some(track),
        "waiting is the thread's, not the queue's"
    );
    check_nesting(&spans(&trace));
}
