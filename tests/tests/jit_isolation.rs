//! The JIT runs in a worker process: every input that kills LLVM (an abort in code generation,
//! an allocation bomb, a runaway compile, malformed bitcode, another target's intrinsics) is one
//! clear error for the caller, the next compile in the same process works, a worker killed from
//! outside costs one retry, the worker never outlives its parent, and processes that compile
//! nothing never map libLLVM.

use offload_core::jit::{CompileRequest, JitService, JitTarget, PostProcess};
use offload_jit_client::limits::{self, Resource};
use offload_jit_client::{JitClient, JitConfig};
use offload_tests::*;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

const HOST: &str = "x86_64-unknown-linux-gnu";

fn worker_path() -> PathBuf {
    let p = build_dir().join("offload-jit-worker");
    assert!(
        p.exists(),
        "{} missing: run cargo build --workspace",
        p.display()
    );
    p
}

fn client_with(f: impl FnOnce(&mut JitConfig)) -> JitClient {
    let mut config = JitConfig {
        worker: Some(worker_path()),
        ..JitConfig::default()
    };
    f(&mut config);
    JitClient::new(Ok(config), Vec::new())
}

fn host_request(ir: &[u8]) -> CompileRequest<'_> {
    CompileRequest {
        image: ir,
        target: JitTarget {
            triple: HOST.into(),
            cpu: "x86-64".into(),
            features: String::new(),
        },
        post: PostProcess::LinkHostSharedObject,
    }
}

/// x86-64 IR whose code generation makes LLVM abort ("LLVM ERROR: Cannot select: intrinsic"):
/// an intrinsic of an instruction set extension that both `x86-64` and this host lack (AMD's
/// XOP, or AVX-512 on the rare host with XOP).
fn codegen_abort_ir() -> String {
    let host_features = host_features();
    if host_features.contains("-xop") {
        "target triple = \"x86_64-unknown-linux-gnu\"\n\
         declare <4 x float> @llvm.x86.xop.vfrcz.ps(<4 x float>)\n\
         define void @k(ptr %p) {\n\
           %v = load <4 x float>, ptr %p\n\
           %r = call <4 x float> @llvm.x86.xop.vfrcz.ps(<4 x float> %v)\n\
           store <4 x float> %r, ptr %p\n\
           ret void\n\
         }\n"
        .into()
    } else {
        assert!(
            host_features.contains("-avx512f"),
            "a host with XOP and AVX-512: {host_features}"
        );
        "target triple = \"x86_64-unknown-linux-gnu\"\n\
         declare <16 x float> @llvm.x86.avx512.rsqrt14.ps.512(<16 x float>, <16 x float>, i16)\n\
         define void @k(ptr %p) {\n\
           %v = load <16 x float>, ptr %p\n\
           %r = call <16 x float> @llvm.x86.avx512.rsqrt14.ps.512(<16 x float> %v, <16 x float> %v, i16 -1)\n\
           store <16 x float> %r, ptr %p\n\
           ret void\n\
         }\n"
            .into()
    }
}

/// The host device's target features, as `offload info` reports them.
fn host_features() -> String {
    let out = offload(&["info", "--json"], &[]);
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    plugin_json(&json, "host")["devices"][0]["target_features"]
        .as_str()
        .unwrap()
        .to_string()
}

/// 100 bytes of IR that make LLVM's parser ask for 32 GiB (a splat constant is materialised).
fn allocation_bomb_ir() -> String {
    "target triple = \"x86_64-unknown-linux-gnu\"\n@g = global <4294967295 x i64> splat (i64 1)\n"
        .into()
}

/// A function with a `cases`-way switch: code generation takes seconds (about 1 s for 3,000
/// cases on this machine, minutes for 20,000).
fn runaway_ir(cases: usize) -> String {
    let mut ir = String::from(
        "target triple = \"x86_64-unknown-linux-gnu\"\ndefine void @k(i32 %x, ptr %p) {\nentry:\n  switch i32 %x, label %d [\n",
    );
    for i in 0..cases {
        ir.push_str(&format!("    i32 {}, label %b{i}\n", i * 7919 % 1_000_003));
    }
    ir.push_str("  ]\n");
    for i in 0..cases {
        ir.push_str(&format!(
            "b{i}:\n  store volatile i32 {i}, ptr %p\n  br label %d\n"
        ));
    }
    ir.push_str("d:\n  ret void\n}\n");
    ir
}

fn foreign_intrinsic_ir() -> String {
    "target triple = \"x86_64-unknown-linux-gnu\"\n\
     declare i32 @llvm.nvvm.read.ptx.sreg.tid.x()\n\
     define void @k(ptr %p) {\n\
       %t = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()\n\
       store i32 %t, ptr %p\n\
       ret void\n\
     }\n"
    .into()
}

fn assert_one_error_line(out: &std::process::Output, what: &str, needles: &[&str]) {
    let err = stderr(out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{what}: status {:?}, stderr {err}",
        out.status
    );
    assert_eq!(err.lines().count(), 1, "{what}: exactly one line: {err}");
    assert!(err.starts_with("offload: error: "), "{what}: {err}");
    assert!(
        !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
        "{what}: {err}"
    );
    for n in needles {
        assert!(err.contains(n), "{what}: '{err}' should contain '{n}'");
    }
}

#[test]
fn every_class_of_fatal_input_is_one_error_line_from_jit_and_run() {
    let dir = scratch("isolation-classes");
    let good = std::fs::read(host_bitcode("saxpy")).unwrap();
    let mut corrupted = good.clone();
    for b in corrupted.iter_mut().skip(60).step_by(5) {
        *b ^= 0xa5;
    }
    /// What, the input, the environment, what the error must say.
    type Case = (
        &'static str,
        Vec<u8>,
        Vec<(&'static str, &'static str)>,
        Vec<&'static str>,
    );
    let cases: Vec<Case> = vec![
        (
            "malformed bitcode",
            good[..good.len() * 2 / 3].to_vec(),
            vec![],
            vec!["malformed LLVM bitcode"],
        ),
        ("corrupted bitcode", corrupted, vec![], vec![]),
        (
            "another target's intrinsic",
            foreign_intrinsic_ir().into_bytes(),
            vec![],
            vec!["llvm.nvvm.read.ptx.sreg.tid.x"],
        ),
        (
            "LLVM aborts in code generation",
            codegen_abort_ir().into_bytes(),
            vec![],
            vec!["JIT worker", "SIGABRT", "LLVM ERROR"],
        ),
        (
            "allocation bomb",
            allocation_bomb_ir().into_bytes(),
            vec![("OFFLOAD_JIT_MEMORY_LIMIT", "2G")],
            vec!["out of memory", "OFFLOAD_JIT_MEMORY_LIMIT=2G"],
        ),
        (
            "runaway compile",
            runaway_ir(20_000).into_bytes(),
            vec![("OFFLOAD_JIT_TIMEOUT", "1")],
            vec!["time limit", "OFFLOAD_JIT_TIMEOUT=1"],
        ),
    ];
    for (what, bytes, env, needles) in cases {
        let path = dir.join(format!("{}.in", what.replace(' ', "_")));
        std::fs::write(&path, &bytes).unwrap();
        let out_path = dir.join("out.so");
        let t = Instant::now();
        let out = offload(
            &[
                "jit",
                path.to_str().unwrap(),
                "--target",
                HOST,
                "--cpu",
                "x86-64",
                "-o",
                out_path.to_str().unwrap(),
            ],
            &env,
        );
        assert_one_error_line(&out, &format!("jit: {what}"), &needles);
        let out = offload(
            &[
                "run",
                path.to_str().unwrap(),
                "--kernel",
                "k",
                "--device",
                "host:0",
            ],
            &env,
        );
        assert_one_error_line(&out, &format!("run: {what}"), &needles);
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{what}: the two commands took {:?}",
            t.elapsed()
        );
    }
}

/// The engine defects of the worker issue, through the command line: each is one error line
/// and exit status 1 (or, for IR that merely starts unusually, a success).
#[test]
fn engine_defect_inputs_through_the_command_line() {
    let dir = scratch("defect-cli");
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let jit = |input: &std::path::Path, target: &str, cpu: &str, features: &str| {
        let out = dir.join("out.bin");
        offload(
            &[
                "jit",
                input.to_str().unwrap(),
                "--target",
                target,
                "--cpu",
                cpu,
                "--features",
                features,
                "-o",
                out.to_str().unwrap(),
            ],
            &[],
        )
    };
    // 6a: IR that starts with comments and declarations compiles.
    let ir = write(
        "commented.ll",
        "; RUN: llc < %s\n; a comment\ndeclare i32 @llvm.nvvm.read.ptx.sreg.tid.x()\ndefine ptx_kernel void @k(ptr %p) {\n  %t = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()\n  store i32 %t, ptr %p\n  ret void\n}\n",
    );
    let out = jit(&ir, "nvptx64-nvidia-cuda", "sm_90", "");
    assert!(out.status.success(), "{}", stderr(&out));
    // 6d: unknown features, and +help, are errors that name them.
    for f in ["+nonsense", "+help"] {
        let out = jit(&ir, "nvptx64-nvidia-cuda", "sm_90", f);
        assert_one_error_line(
            &out,
            &format!("--features {f}"),
            &["unknown target feature", f],
        );
    }
    // 6f: the same module without a triple is not routed by `offload run` ...
    let out = offload(&["run", ir.to_str().unwrap(), "--kernel", "k"], &[]);
    assert_one_error_line(
        &out,
        "run without a triple",
        &["no target triple", "--device"],
    );
    // ... and on the host device it is refused for its NVPTX intrinsic, not crashed on.
    let out = offload(
        &[
            "run",
            ir.to_str().unwrap(),
            "--kernel",
            "k",
            "--device",
            "host:0",
            "--arg",
            "buf:i32:1",
        ],
        &[],
    );
    assert_one_error_line(
        &out,
        "nvptx IR on the host",
        &["llvm.nvvm.read.ptx.sreg.tid.x", "nvptx"],
    );
    // 6e: a function that needs a feature the CPU lacks.
    let wide = write(
        "wide.ll",
        "target triple = \"x86_64-unknown-linux-gnu\"\ndefine void @wide(ptr %p) #0 {\n  store i32 1, ptr %p\n  ret void\n}\nattributes #0 = { \"target-features\"=\"+avx512f\" }\n",
    );
    let out = jit(&wide, "x86_64-unknown-linux-gnu", "x86-64", "-avx512f");
    assert_one_error_line(
        &out,
        "+avx512f on a CPU without it",
        &["function 'wide'", "+avx512f"],
    );
}

#[test]
fn the_caller_survives_and_its_next_compile_works() {
    let client = client_with(|c| {
        c.limits.set(
            Resource::AddressSpace,
            limits::Ask::Explicit {
                value: 2 << 30,
                source: "test limit".into(),
            },
        );
        c.timeout = Some(offload_jit_client::config::Limit {
            value: Duration::from_secs(1),
            source: "test timeout".into(),
        });
    });
    for (round, (what, bad)) in [
        ("abort", codegen_abort_ir()),
        ("bomb", allocation_bomb_ir()),
        ("runaway", runaway_ir(20_000)),
    ]
    .into_iter()
    .enumerate()
    {
        let e = client.compile(&host_request(bad.as_bytes())).unwrap_err();
        assert!(
            matches!(e, offload_core::Error::CompileFailure(_)),
            "{what}: {e:?}"
        );
        let starts = client.worker_stats().starts;
        // The next compile in the same process starts a fresh worker and works.
        let good = format!(
            "target triple = \"x86_64-unknown-linux-gnu\"\ndefine void @k(ptr %p) {{\n  store i32 {round}, ptr %p\n  ret void\n}}\n"
        );
        let out = client.compile(&host_request(good.as_bytes())).unwrap();
        assert!(!out.image.bytes.is_empty());
        assert_eq!(
            client.worker_stats().starts,
            starts + 1,
            "{what}: one fresh worker"
        );
        // A key that killed the worker is not compiled again.
        let again = client.compile(&host_request(bad.as_bytes())).unwrap_err();
        assert!(
            again.to_string().contains("failed before"),
            "{what}: {again}"
        );
        assert_eq!(
            client.worker_stats().starts,
            starts + 1,
            "{what}: no worker killed again"
        );
    }
    assert_eq!(client.worker_stats().deaths, 3);
    assert_eq!(client.worker_stats().timeouts, 1);
}

fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn kill(pid: u32) {
    // SAFETY: sending a signal has no memory-safety preconditions.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
}

#[test]
fn a_worker_killed_from_outside_costs_one_retry_then_an_error() {
    let client = Arc::new(client_with(|c| c.timeout = None));
    let slow = runaway_ir(20_000);
    let result = std::thread::scope(|s| {
        let c = client.clone();
        let slow = &slow;
        let h = s.spawn(move || c.compile(&host_request(slow.as_bytes())));
        // Kill the first worker once it has the compile (written to it in full, not answered);
        // the compile is retried on a fresh worker.
        wait_for("the first worker", Duration::from_secs(20), || {
            client.worker_pid().is_some() && client.worker_stats().sent == 1
        });
        let first = client.worker_pid().unwrap();
        kill(first);
        wait_for("the retry's worker", Duration::from_secs(20), || {
            client.worker_pid().is_some_and(|p| p != first) && client.worker_stats().sent == 2
        });
        assert_eq!(client.worker_stats().retries, 1);
        let second = client.worker_pid().unwrap();
        kill(second);
        h.join().unwrap()
    });
    let e = result.unwrap_err().to_string();
    assert!(e.contains("SIGKILL") && e.contains("retried"), "{e}");
    // Both dead workers were reaped: no zombies.
    for line in std::fs::read_dir("/proc").unwrap().filter_map(|e| e.ok()) {
        let Ok(stat) = std::fs::read_to_string(line.path().join("stat")) else {
            continue;
        };
        if stat.contains("(offload-jit-wor") {
            let fields: Vec<&str> = stat
                .rsplit(')')
                .next()
                .unwrap()
                .split_whitespace()
                .collect();
            let ppid: u32 = fields[1].parse().unwrap();
            assert!(
                !(fields[0] == "Z" && ppid == std::process::id()),
                "zombie worker: {stat}"
            );
        }
    }
    // And the process goes on compiling.
    let good = std::fs::read(host_bitcode("saxpy")).unwrap();
    client.compile(&host_request(&good)).unwrap();
}

#[test]
fn compiles_in_flight_when_another_kills_the_worker_are_retried_and_succeed() {
    let client = Arc::new(client_with(|c| c.timeout = None));
    let slow = runaway_ir(5_000);
    std::thread::scope(|s| {
        let c = client.clone();
        let slow = &slow;
        let h = s.spawn(move || c.compile(&host_request(slow.as_bytes())));
        // The worker has the slow compile (written to it in full, not answered) when the
        // abort kills it.
        wait_for("the slow compile", Duration::from_secs(20), || {
            client.worker_stats().sent == 1 && client.worker_pid().is_some()
        });
        let e = client
            .compile(&host_request(codegen_abort_ir().as_bytes()))
            .unwrap_err();
        assert!(e.to_string().contains("SIGABRT"), "{e}");
        let slow_result = h.join().unwrap();
        assert!(
            slow_result.is_ok(),
            "the innocent compile was retried: {slow_result:?}"
        );
    });
    let w = client.worker_stats();
    assert_eq!((w.deaths, w.retries), (1, 1), "{w:?}");
}

fn children_named(parent: u32, name: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().filter_map(|e| e.ok()) {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some((head, tail)) = stat.rsplit_once(')') else {
            continue;
        };
        let comm = head.split_once('(').map(|x| x.1).unwrap_or("");
        let ppid: u32 = tail
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        if ppid == parent && name.starts_with(comm) {
            found.push(pid);
        }
    }
    found
}

/// A host kernel that sleeps `ms` milliseconds in every work item.
fn sleepy_kernel(dir: &std::path::Path, bitcode: bool) -> PathBuf {
    let src = dir.join("sleepy.c");
    std::fs::write(
        &src,
        "#include <unistd.h>\nvoid sleepy(int ms) { usleep(ms * 1000); }\n",
    )
    .unwrap();
    let out = dir.join(if bitcode { "sleepy.bc" } else { "sleepy.so" });
    let args: Vec<&str> = if bitcode {
        vec!["-O2", "-fPIC", "-emit-llvm", "-c"]
    } else {
        vec!["-O2", "-fPIC", "-shared"]
    };
    let mut all = args.clone();
    all.extend([src.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    clang(&all);
    out
}

#[test]
fn the_worker_exits_with_its_parent() {
    let dir = scratch("worker-parent");
    let bc = sleepy_kernel(&dir, true);
    let mut child = std::process::Command::new(offload_bin())
        .args([
            "run",
            bc.to_str().unwrap(),
            "--kernel",
            "sleepy",
            "--arg",
            "i32:20000",
        ])
        .env_remove("OFFLOAD_PLUGIN_PATH")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut worker = Vec::new();
    wait_for(
        "the worker of the offload process",
        Duration::from_secs(20),
        || {
            worker = children_named(child.id(), "offload-jit-worker");
            !worker.is_empty()
        },
    );
    // The kernel is sleeping now (its compile finished); kill the parent outright.
    child.kill().unwrap();
    child.wait().unwrap();
    wait_for(
        "the orphaned worker to exit",
        Duration::from_secs(10),
        || {
            !std::path::Path::new(&format!("/proc/{}", worker[0])).exists()
                || std::fs::read_to_string(format!("/proc/{}/stat", worker[0]))
                    .map(|s| s.contains(") Z"))
                    .unwrap_or(true)
        },
    );
}

fn no_llvm(what: &str, text: &str) {
    assert!(!text.contains("libLLVM"), "{what} loads libLLVM:\n{text}");
}

#[test]
fn processes_that_compile_nothing_never_map_libllvm() {
    // Nothing that ships in the runtime's process links LLVM.
    for lib in [
        offload_bin(),
        host_plugin_dir().join("liboffload_plugin_host.so"),
    ] {
        let out = std::process::Command::new("ldd")
            .arg(&lib)
            .output()
            .unwrap();
        assert!(out.status.success());
        no_llvm(
            &format!("ldd {}", lib.display()),
            &String::from_utf8_lossy(&out.stdout),
        );
    }
    // ... and no library loaded at run time brings it in (LD_DEBUG=files lists every load,
    // dlopen'ed plugins included; the worker's own output never reaches our stderr).
    let dir = scratch("no-llvm");
    let so = host_kernel("saxpy");
    let bc = host_bitcode("saxpy");
    let run = |image: &std::path::Path| {
        vec![
            "run".to_string(),
            image.display().to_string(),
            "--kernel".into(),
            "saxpy".into(),
            "--arg".into(),
            "i32:4".into(),
            "--arg".into(),
            "f32:1".into(),
            "--arg".into(),
            "buf:f32:4".into(),
            "--arg".into(),
            "buf:f32:4".into(),
        ]
    };
    let commands: Vec<Vec<String>> = vec![
        vec!["--help".into()],
        vec!["info".into()],
        vec!["info".into(), "--json".into()],
        run(&so),
        run(&bc),
    ];
    for args in commands {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = offload(&args, &[("LD_DEBUG", "files")]);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        let text = stderr(&out);
        assert!(
            text.contains("liboffload_plugin_host") || args[0] == "--help",
            "LD_DEBUG works: {text}"
        );
        no_llvm(&format!("offload {args:?}"), &text);
    }
    // /proc/PID/maps of a native run, read while its kernel sleeps.
    let sleepy = sleepy_kernel(&dir, false);
    let mut child = std::process::Command::new(offload_bin())
        .args([
            "run",
            sleepy.to_str().unwrap(),
            "--kernel",
            "sleepy",
            "--arg",
            "i32:3000",
        ])
        .env_remove("OFFLOAD_PLUGIN_PATH")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let maps_path = format!("/proc/{}/maps", child.id());
    let mut maps = String::new();
    wait_for(
        "the host plugin in the maps",
        Duration::from_secs(10),
        || {
            maps = std::fs::read_to_string(&maps_path).unwrap_or_default();
            maps.contains("liboffload_plugin_host")
        },
    );
    no_llvm("maps of offload run (native)", &maps);
    assert!(child.wait().unwrap().success());
}

/// Seeded mutants of the bitcode and IR front doors, loaded through the runtime in this
/// process: each is an image or an error, and this process never sees a signal.
#[test]
fn hundreds_of_mutated_bitcode_images_never_signal_the_caller() {
    let rt = host_runtime();
    let device = rt.device("host", 0).unwrap();
    let bitcode = std::fs::read(host_bitcode("saxpy")).unwrap();
    let (loaded, refused, reasons) = load_mutants(&device, 300, 0x5eed);
    let w = rt.jit().worker_stats();
    println!(
        "300 mutants: {loaded} loaded, {refused} refused; worker starts {}, deaths {}",
        w.starts, w.deaths
    );
    for (r, n) in &reasons {
        println!("  {n:4} {r}");
    }
    assert_eq!(loaded + refused, 300);
    // The process is alive and still compiles the original.
    offload_tests::load(&device, &bitcode)
        .unwrap()
        .kernel("saxpy")
        .unwrap();
}

/// Loads `n` seeded mutants of the saxpy kernel's bitcode and IR (bytes flipped, truncated,
/// overwritten, chunks duplicated) on `device`: how many loaded, how many were refused, and the
/// refusals grouped by the gist of their message.
fn load_mutants(
    device: &offload::Device,
    n: usize,
    seed: u64,
) -> (usize, usize, std::collections::BTreeMap<String, usize>) {
    let bitcode = std::fs::read(host_bitcode("saxpy")).unwrap();
    let ir = std::fs::read(kernel_ir("saxpy", &[], "ll")).unwrap();
    let mut seq = offload_core::rand::XorShift(seed);
    let mut next = || seq.next_u64();
    let (mut loaded, mut refused) = (0, 0);
    let mut reasons: std::collections::BTreeMap<String, usize> = Default::default();
    for i in 0..n {
        let base = if i % 4 == 3 { &ir } else { &bitcode };
        let mut m = base.clone();
        match next() % 4 {
            0 => {
                // Flip a few bytes.
                for _ in 0..1 + next() % 4 {
                    let at = (next() as usize) % m.len();
                    m[at] ^= 1 << (next() % 8);
                }
            }
            1 => {
                let at = 4 + (next() as usize) % (m.len() - 4);
                m.truncate(at);
            }
            2 => {
                // Overwrite a run with random bytes.
                let at = (next() as usize) % m.len();
                let len = (1 + next() % 16) as usize;
                for b in m.iter_mut().skip(at).take(len) {
                    *b = next() as u8;
                }
            }
            _ => {
                // Duplicate a chunk somewhere else.
                let a = (next() as usize) % m.len();
                let len = ((next() % 64) as usize).min(m.len() - a);
                let chunk = m[a..a + len].to_vec();
                let at = (next() as usize) % m.len();
                m.splice(at..at, chunk);
            }
        }
        match offload_tests::load(device, &m) {
            Ok(_) => loaded += 1,
            Err(e) => {
                refused += 1;
                // Group by the error's gist: its text up to the first position-specific detail.
                let text = e.to_string();
                let class: String = text
                    .split(|c: char| c.is_ascii_digit())
                    .next()
                    .unwrap_or("")
                    .chars()
                    .take(90)
                    .collect();
                *reasons.entry(class).or_default() += 1;
            }
        }
    }
    (loaded, refused, reasons)
}

/// Issue 17's held-out run: mutated bitcode in a process under an inherited 8 GiB hard limit
/// on address space (as a batch system sets). The worker starts (its default limit is the
/// inherited one), so mutants reach the compiler: some load, none fails at the worker's start.
#[test]
fn mutated_bitcode_under_an_inherited_address_space_limit_reaches_the_compiler() {
    const CHILD: &str = "OFFLOAD_TEST_MUTANTS_CHILD";
    if std::env::var_os(CHILD).is_some() {
        let rt = host_runtime();
        let device = rt.device("host", 0).unwrap();
        let (loaded, refused, reasons) = load_mutants(&device, 80, 0xa5_1e17);
        let w = rt.jit().worker_stats();
        println!(
            "MUTANTS loaded={loaded} refused={refused} starts={}",
            w.starts
        );
        for (r, n) in &reasons {
            println!("  {n:4} {r}");
        }
        assert!(
            reasons
                .keys()
                .all(|r| !r.contains("cannot start the JIT worker")),
            "{reasons:?}"
        );
        return;
    }
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "mutated_bitcode_under_an_inherited_address_space_limit_reaches_the_compiler",
        "--nocapture",
    ])
    .env(CHILD, "1");
    for r in limits::RESOURCES {
        cmd.env_remove(r.variable());
    }
    // SAFETY: only setrlimit between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let rl = libc::rlimit {
                rlim_cur: 8 << 30,
                rlim_max: 8 << 30,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &rl) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert!(out.status.success(), "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("MUTANTS"))
        .unwrap_or_else(|| panic!("{text}"));
    let loaded: usize = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("loaded="))
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(
        loaded > 0,
        "no mutant reached and passed the compiler: {text}"
    );
}

/// The triple reader runs in the caller's process (routing happens before any worker): every
/// truncation and every single-bit flip of real clang bitcode, for each target, is a triple or
/// an error naming the problem, never a panic or a loop.
#[test]
fn the_triple_reader_survives_every_bit_flip_of_real_bitcode() {
    for (target, want) in [
        (vec![], "x86_64-pc-linux-gnu"),
        (
            vec!["-target", "nvptx64-nvidia-cuda", "-march=sm_90"],
            "nvptx64-nvidia-cuda",
        ),
        (
            vec!["-target", "amdgcn-amd-amdhsa", "-mcpu=gfx90a", "-nogpulib"],
            "amdgcn-amd-amdhsa",
        ),
    ] {
        let bc = std::fs::read(kernel_ir("saxpy", &target, "bc")).unwrap();
        assert_eq!(
            offload_core::image::bitcode::module_triple(&bc).unwrap(),
            want
        );
        let (mut ok, mut refused) = (0usize, 0usize);
        let started = Instant::now();
        for len in 0..bc.len() {
            match offload_core::image::bitcode::module_triple(&bc[..len]) {
                Ok(_) => ok += 1,
                Err(e) => {
                    assert!(e.to_string().contains("malformed LLVM bitcode"), "{e}");
                    refused += 1;
                }
            }
        }
        for bit in 0..bc.len() * 8 {
            let mut m = bc.clone();
            m[bit / 8] ^= 1 << (bit % 8);
            match offload_core::image::bitcode::module_triple(&m) {
                Ok(_) => ok += 1,
                Err(e) => {
                    assert!(e.to_string().contains("malformed LLVM bitcode"), "{e}");
                    refused += 1;
                }
            }
        }
        println!(
            "{want}: {} bytes, {ok} mutants read, {refused} refused, {:?}",
            bc.len(),
            started.elapsed()
        );
    }
}

/// `offload ARGS` in a child whose soft and hard limits are lowered before `exec`, as a shell's
/// `ulimit` or a batch system leaves them.
fn offload_limited(
    args: &[&str],
    envs: &[(&str, &str)],
    limits: &[(Resource, u64, u64)],
) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(offload_bin());
    cmd.args(args)
        .env_remove("OFFLOAD_PLUGIN_PATH")
        .env_remove("OFFLOAD_PLUGINS");
    for r in limits::RESOURCES {
        cmd.env_remove(r.variable());
    }
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let limits: Vec<(Resource, u64, u64)> = limits.to_vec();
    // SAFETY: the closure runs in the child between fork and exec and only calls setrlimit.
    unsafe {
        cmd.pre_exec(move || {
            for (r, soft, hard) in &limits {
                let rl = libc::rlimit {
                    rlim_cur: *soft,
                    rlim_max: *hard,
                };
                if libc::setrlimit(r.raw(), &rl) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    cmd.output().expect("run offload")
}

/// `offload run` of the saxpy bitcode kernel on 256 elements: `y = 2 * iota + 1`.
fn saxpy_run_args(bitcode: &std::path::Path, dump: &std::path::Path) -> Vec<String> {
    [
        "run",
        bitcode.to_str().unwrap(),
        "--kernel",
        "saxpy",
        "--device",
        "host:0",
        "--grid",
        "4",
        "--block",
        "64",
        "--arg",
        "u32:256",
        "--arg",
        "f32:2",
        "--arg",
        "buf:f32:256:iota",
        "--arg",
        "buf:f32:256:fill=1",
        "--dump",
        dump.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn jit_limits_json(out: &std::process::Output) -> serde_json::Value {
    assert!(out.status.success(), "info failed: {}", stderr(out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("info --json");
    v["jit"]["limits"].clone()
}

/// Issue 17: under an inherited hard limit on each resource, the worker starts and compiles
/// (its default never exceeds the inherited limit, and `offload info` says that one applied),
/// an explicit value above the hard limit is one error line naming both numbers, and one
/// below it applies.
#[test]
fn every_worker_limit_stays_under_a_lowered_hard_limit() {
    let bitcode = host_bitcode("saxpy");
    let dir = scratch("limits");
    let expected: Vec<f32> = (0..256).map(|i| 2.0 * i as f32 + 1.0).collect();
    // (resource, the hard limit, a value above it, a value below it)
    let cases: [(Resource, u64, &str, &str); 4] = [
        (Resource::AddressSpace, 8 << 30, "16G", "6G"),
        (Resource::CpuTime, 3000, "6000", "600"),
        (Resource::FileSize, 1 << 30, "2G", "256M"),
        (Resource::OpenFiles, 256, "512", "128"),
    ];
    for (r, hard, above, below) in cases {
        let var = r.variable();
        let what = format!("{var} under a hard limit of {hard}");
        let lim = [(r, hard, hard)];
        let run = |envs: &[(&str, &str)], tag: &str| {
            let dump = dir.join(format!("{}-{tag}", r.key()));
            std::fs::create_dir_all(&dump).unwrap();
            let args = saxpy_run_args(&bitcode, &dump);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            (offload_limited(&args, envs, &lim), dump)
        };

        // The default: the worker starts under the inherited limit and the result is right.
        let (out, dump) = run(&[], "default");
        assert!(out.status.success(), "{what}: {}", stderr(&out));
        assert!(
            stdout(&out).contains("1 compile(s)"),
            "{what}: {}",
            stdout(&out)
        );
        assert_eq!(read_f32s(&dump.join("arg3.bin")), expected, "{what}");
        let limits = jit_limits_json(&offload_limited(&["info", "--json"], &[], &lim));
        assert_eq!(limits[r.key()]["value"], hard, "{what}: {limits}");
        let source = limits[r.key()]["source"].as_str().unwrap();
        assert!(
            source.contains("inherited") && source.contains(r.rlimit_name()),
            "{what}: {source}"
        );
        let text = stdout(&offload_limited(&["info"], &[], &lim));
        assert!(text.contains(&r.show(Some(hard))), "{what}: {text}");

        // Above the hard limit: a clear error naming both numbers, from run and from jit.
        let (out, _) = run(&[(var, above)], "above");
        let above_value = r.parse(above).unwrap();
        assert_one_error_line(
            &out,
            &what,
            &[
                &format!("{var}={above}"),
                &r.show(Some(above_value)),
                &r.show(Some(hard)),
                "hard limit",
            ],
        );
        let info = stdout(&offload_limited(&["info"], &[(var, above)], &lim));
        assert!(info.contains(&format!("{var}={above}")), "{what}: {info}");

        // Below it: applied, and named.
        let (out, dump) = run(&[(var, below)], "below");
        assert!(out.status.success(), "{what} {below}: {}", stderr(&out));
        assert_eq!(read_f32s(&dump.join("arg3.bin")), expected, "{what}");
        let limits = jit_limits_json(&offload_limited(&["info", "--json"], &[(var, below)], &lim));
        assert_eq!(limits[r.key()]["value"], r.parse(below).unwrap(), "{what}");
        assert_eq!(
            limits[r.key()]["source"].as_str().unwrap(),
            format!("{var}={below}"),
            "{what}"
        );
    }

    // A soft limit under a higher hard one: the default takes the soft one; an explicit value
    // between the two is allowed (raising a soft limit is what it is for).
    let lim = [(Resource::AddressSpace, 6 << 30, 8 << 30)];
    let limits = jit_limits_json(&offload_limited(&["info", "--json"], &[], &lim));
    assert_eq!(limits["address_space"]["value"], 6u64 << 30, "{limits}");
    let dump = dir.join("soft");
    std::fs::create_dir_all(&dump).unwrap();
    let args = saxpy_run_args(&bitcode, &dump);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = offload_limited(&args, &[("OFFLOAD_JIT_MEMORY_LIMIT", "7G")], &lim);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(read_f32s(&dump.join("arg3.bin")), expected);
}

/// A compile that hits the CPU-time or the file-size limit is one error line that names the
/// limit and the variable that set it.
#[test]
fn a_compile_that_hits_a_worker_limit_names_it() {
    let dir = scratch("limit-hits");
    let compile = |ir: &str, envs: &[(&str, &str)]| {
        let input = dir.join("in.ll");
        std::fs::write(&input, ir).unwrap();
        let out_path = dir.join("out.so");
        offload_limited(
            &[
                "jit",
                input.to_str().unwrap(),
                "--target",
                HOST,
                "--cpu",
                "x86-64",
                "-o",
                out_path.to_str().unwrap(),
            ],
            envs,
            &[],
        )
    };
    // CPU time: a compile that takes minutes, under a 1 s limit (the error's SIGXCPU says the
    // limit, not the 120 s timeout, ended it).
    let out = compile(
        &runaway_ir(20_000),
        &[
            ("OFFLOAD_JIT_CPU_LIMIT", "1"),
            ("OFFLOAD_JIT_TIMEOUT", "120"),
        ],
    );
    assert_one_error_line(
        &out,
        "CPU time",
        &["CPU time limit", "OFFLOAD_JIT_CPU_LIMIT=1", "SIGXCPU"],
    );
    // File size: the IR dump of a module larger than the 4 KiB limit.
    let dump = dir.join("post.ll");
    let out = compile(
        &runaway_ir(300),
        &[
            ("OFFLOAD_JIT_FILE_SIZE_LIMIT", "4096"),
            ("OFFLOAD_JIT_PRE_OPT_IR_MODULE", dump.to_str().unwrap()),
        ],
    );
    assert_one_error_line(
        &out,
        "file size",
        &["file size limit", "OFFLOAD_JIT_FILE_SIZE_LIMIT=4096"],
    );
    // The same compile under a limit it fits in works.
    let out = compile(
        &runaway_ir(300),
        &[
            ("OFFLOAD_JIT_FILE_SIZE_LIMIT", "64M"),
            ("OFFLOAD_JIT_PRE_OPT_IR_MODULE", dump.to_str().unwrap()),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
}
