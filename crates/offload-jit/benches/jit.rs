//! JIT benchmark. Every number is printed next to a reference measured in the same run:
//!
//! 1. cold compile of small kernels (clang-19 output of `kernels/*.c`) and of one large module
//!    (≥ 1 MB of bitcode): through the JIT worker process (warm worker, no cache) vs the engine
//!    in this process vs `opt-19 -O3 | llc-19 -O3` as processes (plus `ld.lld-19` for the host,
//!    whose plugin loads a linked shared object);
//! 2. the first compile of a process, worker start included, vs the same compile in process;
//! 3. warm cache-hit latency for a 1 MiB and a 16 MiB image next to the time to hash those
//!    bytes once with BLAKE3 (a hit costs one hash of the image plus a map lookup);
//! 4. the compile count when 16 threads ask for the same key at once (single flight);
//! 5. the speedup of compiling two different images from two threads over compiling them one
//!    after the other, both inside one worker (upstream serialises all compiles of a plugin);
//! 6. whole `offload` processes (release build, `cargo build --release --workspace` first):
//!    `offload info`, `offload run` of a native image, and of bitcode (cold worker), each next
//!    to the same process of the pre-worker build when `OFFLOAD_BENCH_BASELINE` names one.
//!
//!     cargo build --release --workspace && cargo bench -p offload-jit --bench jit

use inkwell::context::Context;
use inkwell::memory_buffer::MemoryBuffer;
use offload_core::jit::protocol::{self, WorkerRequest};
use offload_core::jit::{CompileRequest, JitOptions, JitService, JitTarget, PostProcess, Served};
use offload_jit_client::worker::{Supervisor, WorkerSettings};
use offload_jit_client::{JitClient, JitConfig};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const WORKER: &str = env!("CARGO_BIN_EXE_offload-jit-worker");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn scratch() -> PathBuf {
    let d = std::env::temp_dir().join(format!("offload-jit-bench-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

struct Target {
    name: &'static str,
    triple: &'static str,
    cpu: &'static str,
    clang: &'static [&'static str],
    llc: &'static [&'static str],
    link: bool,
}

const TARGETS: [Target; 3] = [
    Target {
        name: "nvptx64 sm_90",
        triple: "nvptx64-nvidia-cuda",
        cpu: "sm_90",
        clang: &["-target", "nvptx64-nvidia-cuda", "-march=sm_90"],
        llc: &[],
        link: false,
    },
    Target {
        name: "amdgcn gfx90a",
        triple: "amdgcn-amd-amdhsa",
        cpu: "gfx90a",
        clang: &["-target", "amdgcn-amd-amdhsa", "-mcpu=gfx90a", "-nogpulib"],
        llc: &["-filetype=obj"],
        link: false,
    },
    Target {
        name: "x86-64 host",
        triple: "x86_64-unknown-linux-gnu",
        cpu: "x86-64",
        clang: &["-target", "x86_64-unknown-linux-gnu", "-fPIC"],
        llc: &["-filetype=obj", "-relocation-model=pic"],
        link: true,
    },
];

fn tools_compile(t: &Target, input: &Path, out: &Path) -> Duration {
    let started = Instant::now();
    let mut opt = Command::new("opt-19")
        .args([
            "-O3",
            &format!("-mcpu={}", t.cpu),
            input.to_str().unwrap(),
            "-o",
            "-",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("opt-19");
    let obj = out.with_extension("o");
    let llc = Command::new("llc-19")
        .args(["-O3", &format!("-mcpu={}", t.cpu)])
        .args(t.llc)
        .args(["-", "-o", obj.to_str().unwrap()])
        .stdin(opt.stdout.take().unwrap())
        .status()
        .expect("llc-19");
    assert!(llc.success() && opt.wait().unwrap().success());
    if t.link {
        let s = Command::new("ld.lld-19")
            .args([
                "-shared",
                "-o",
                out.to_str().unwrap(),
                obj.to_str().unwrap(),
            ])
            .status()
            .expect("ld.lld-19");
        assert!(s.success());
    }
    started.elapsed()
}

fn jit_target(t: &Target) -> JitTarget {
    JitTarget {
        triple: t.triple.into(),
        cpu: t.cpu.into(),
        features: String::new(),
    }
}

fn post(t: &Target) -> PostProcess {
    if t.link {
        PostProcess::LinkHostSharedObject
    } else {
        PostProcess::Unchanged
    }
}

fn payload(t: &Target, image: &[u8]) -> Vec<u8> {
    protocol::encode_compile(&jit_target(t), &post(t), &JitOptions::default(), image)
}

fn supervisor() -> Supervisor {
    Supervisor::new(WorkerSettings {
        path: WORKER.into(),
        limits: {
            use offload_jit_client::limits::{Ask, Resource, WorkerLimits};
            let mut l = WorkerLimits::default();
            l.set(
                Resource::AddressSpace,
                Ask::Inherit {
                    source: "the benchmark sets none".into(),
                },
            );
            l
        },
        timeout: None,
        llvm_version: offload_jit_client::LLVM_VERSION.into(),
        engine_version: offload_jit_client::ENGINE_VERSION.into(),
    })
}

fn in_process(t: &Target, image: &[u8]) -> Duration {
    let started = Instant::now();
    offload_jit::compile_request(&WorkerRequest {
        target: jit_target(t),
        post: post(t),
        options: JitOptions::default(),
        image,
    })
    .unwrap();
    started.elapsed()
}

fn on_worker(s: &Supervisor, t: &Target, image: &[u8]) -> Duration {
    let p = payload(t, image);
    let started = Instant::now();
    s.compile(&p, &|| "bench".into())
        .map_err(|e| format!("{e:?}"))
        .unwrap();
    started.elapsed()
}

/// A module of `functions` loop kernels for the x86-64 host, as bitcode.
fn large_module(functions: usize) -> Vec<u8> {
    let mut ir = String::from(
        "source_filename = \"large.ll\"\ntarget triple = \"x86_64-unknown-linux-gnu\"\n",
    );
    for f in 0..functions {
        ir.push_str(&format!(
            "define void @k{f}(ptr noalias %a, ptr noalias %b, i64 %n) {{\n\
             entry:\n  %z = icmp eq i64 %n, 0\n  br i1 %z, label %exit, label %loop\n\
             loop:\n  %i = phi i64 [ 0, %entry ], [ %i.next, %loop ]\n\
             \x20 %pa = getelementptr float, ptr %a, i64 %i\n  %pb = getelementptr float, ptr %b, i64 %i\n\
             \x20 %va = load float, ptr %pa\n  %vb = load float, ptr %pb\n\
             \x20 %m = fmul float %va, {f}.0\n  %s = fadd float %m, %vb\n  %t = fmul float %s, %s\n\
             \x20 %u = fsub float %t, {f}.5\n  store float %u, ptr %pa\n\
             \x20 %i.next = add i64 %i, 1\n  %more = icmp ult i64 %i.next, %n\n\
             \x20 br i1 %more, label %loop, label %exit\n\
             exit:\n  ret void\n}}\n"
        ));
    }
    to_bitcode(&ir)
}

fn to_bitcode(ir: &str) -> Vec<u8> {
    let context = Context::create();
    let buffer = MemoryBuffer::create_from_memory_range_copy(ir.as_bytes(), "ir");
    let module = context.create_module_from_ir(buffer).unwrap();
    module.write_bitcode_to_memory().as_slice().to_vec()
}

/// A module holding `bytes` of incompressible constant data, as bitcode.
fn data_module(bytes: usize, seed: u64) -> Vec<u8> {
    let context = Context::create();
    let module = context.create_module("data");
    module.set_triple(&inkwell::targets::TargetTriple::create(
        "x86_64-unknown-linux-gnu",
    ));
    let mut seq = offload_core::rand::XorShift(seed | 1);
    let data: Vec<u8> = (0..bytes).map(|_| (seq.next_u64() >> 24) as u8).collect();
    let value = context.const_string(&data, false);
    let global = module.add_global(value.get_type(), None, "table");
    global.set_initializer(&value);
    global.set_constant(true);
    module.write_bitcode_to_memory().as_slice().to_vec()
}

fn client() -> JitClient {
    JitClient::new(
        Ok(JitConfig {
            worker: Some(WORKER.into()),
            ..JitConfig::default()
        }),
        Vec::new(),
    )
}

fn clang_bitcode(t: &Target, k: &str, dir: &Path) -> PathBuf {
    let bc = dir.join(format!("{k}.{}.bc", t.cpu));
    let s = Command::new("clang-19")
        .args([
            "-O2",
            "-emit-llvm",
            "-c",
            "-I",
            repo().join("include").to_str().unwrap(),
        ])
        .args(t.clang)
        .args([
            repo()
                .join("kernels")
                .join(format!("{k}.c"))
                .to_str()
                .unwrap(),
            "-o",
            bc.to_str().unwrap(),
        ])
        .status()
        .expect("clang-19");
    assert!(s.success());
    bc
}

/// Median wall time of `runs` runs of `offload ARGS` (exit status checked).
fn process_time(offload: &Path, args: &[&str], env: &[(&str, &str)], runs: usize) -> Duration {
    median(
        (0..runs)
            .map(|_| {
                let mut cmd = Command::new(offload);
                cmd.args(args).stdout(Stdio::null()).stderr(Stdio::null());
                for (k, v) in env {
                    cmd.env(k, v);
                }
                let t = Instant::now();
                let status = cmd.status().expect("offload");
                let d = t.elapsed();
                assert!(status.success(), "{offload:?} {args:?} failed");
                d
            })
            .collect(),
    )
}

fn main() {
    let dir = scratch();
    println!(
        "offload-jit benchmark ({} cores)\n",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );

    println!(
        "1. cold compile, median of 5: through the worker (warm worker, no cache) vs in this process vs opt-19 -O3 | llc-19 -O3 (+ ld.lld-19 for the host)"
    );
    println!(
        "   {:<34} {:>10} {:>11} {:>10} {:>12} {:>12}",
        "input", "worker ms", "in-proc ms", "tools ms", "tools/worker", "worker/inproc"
    );
    let warm = supervisor();
    for t in &TARGETS {
        for k in ["saxpy", "stencil2d", "args16"] {
            let bc = clang_bitcode(t, k, &dir);
            let image = std::fs::read(&bc).unwrap();
            on_worker(&warm, t, &image); // warm the worker up
            let worker = median((0..5).map(|_| on_worker(&warm, t, &image)).collect());
            let inproc = median((0..5).map(|_| in_process(t, &image)).collect());
            let tools = median(
                (0..5)
                    .map(|_| tools_compile(t, &bc, &dir.join("out.so")))
                    .collect(),
            );
            println!(
                "   {:<34} {:>10.2} {:>11.2} {:>10.2} {:>11.1}x {:>12.2}x",
                format!("{k} ({})", t.name),
                ms(worker),
                ms(inproc),
                ms(tools),
                ms(tools) / ms(worker),
                ms(worker) / ms(inproc)
            );
        }
    }
    let large = large_module(6000);
    let large_path = dir.join("large.bc");
    std::fs::write(&large_path, &large).unwrap();
    let host = &TARGETS[2];
    let worker = on_worker(&warm, host, &large);
    let inproc = in_process(host, &large);
    let tools = tools_compile(host, &large_path, &dir.join("large.so"));
    println!(
        "   {:<34} {:>10.1} {:>11.1} {:>10.1} {:>11.2}x {:>12.2}x",
        format!(
            "large ({:.2} MB bc, 6000 fns, host)",
            large.len() as f64 / 1e6
        ),
        ms(worker),
        ms(inproc),
        ms(tools),
        ms(tools) / ms(worker),
        ms(worker) / ms(inproc)
    );

    println!(
        "\n2. first compile of a process (worker start + handshake + compile) vs in this process, saxpy, median of 5"
    );
    for t in &TARGETS {
        let image = std::fs::read(clang_bitcode(t, "saxpy", &dir)).unwrap();
        let first = median(
            (0..5)
                .map(|_| {
                    let fresh = supervisor();
                    on_worker(&fresh, t, &image)
                })
                .collect(),
        );
        let inproc = median((0..5).map(|_| in_process(t, &image)).collect());
        println!(
            "   {:<20} first (cold worker) {:>8.2} ms, in-process {:>8.2} ms, worker start costs {:>7.2} ms",
            t.name,
            ms(first),
            ms(inproc),
            ms(first) - ms(inproc)
        );
    }

    println!("\n3. warm cache hit vs one BLAKE3 hash of the same bytes (mean of 50)");
    println!(
        "   {:<14} {:>12} {:>12} {:>8}",
        "image", "hit ms", "hash ms", "ratio"
    );
    for mib in [1usize, 16] {
        let image = data_module(mib << 20, mib as u64);
        let c = client();
        let req = CompileRequest {
            image: &image,
            target: jit_target(host),
            post: PostProcess::Unchanged,
        };
        c.compile(&req).unwrap();
        let n = 50;
        let t = Instant::now();
        for _ in 0..n {
            let out = c.compile(&req).unwrap();
            assert_eq!(out.served, Served::MemoryHit);
        }
        let hit = t.elapsed() / n;
        let t = Instant::now();
        for _ in 0..n {
            std::hint::black_box(blake3::hash(std::hint::black_box(&image)));
        }
        let hash = t.elapsed() / n;
        println!(
            "   {:<14} {:>12.3} {:>12.3} {:>7.2}x",
            format!("{:.1} MiB bc", image.len() as f64 / (1 << 20) as f64),
            ms(hit),
            ms(hash),
            ms(hit) / ms(hash)
        );
    }

    println!("\n4. single flight: 16 threads request the same key at once");
    let c = Arc::new(client());
    let image = Arc::new(large_module(300));
    let barrier = Arc::new(std::sync::Barrier::new(16));
    let handles: Vec<_> = (0..16)
        .map(|_| {
            let (c, image, barrier) = (c.clone(), image.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                c.compile(&CompileRequest {
                    image: &image,
                    target: jit_target(&TARGETS[2]),
                    post: PostProcess::Unchanged,
                })
                .unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let st = c.stats();
    println!(
        "   compiles: {} (requests: 16; served from memory: {}, waited for the shared compile: {})",
        st.compiles, st.memory_hits, st.shared_waits
    );

    println!(
        "\n5. two different images in one warm worker: one after the other vs two threads (median of 3)"
    );
    let a = large_module(700);
    let b = large_module(701);
    let sequential = median(
        (0..3)
            .map(|_| {
                let t = Instant::now();
                on_worker(&warm, host, &a);
                on_worker(&warm, host, &b);
                t.elapsed()
            })
            .collect(),
    );
    let parallel = median(
        (0..3)
            .map(|_| {
                let t = Instant::now();
                std::thread::scope(|s| {
                    s.spawn(|| on_worker(&warm, host, &a));
                    s.spawn(|| on_worker(&warm, host, &b));
                });
                t.elapsed()
            })
            .collect(),
    );
    println!(
        "   sequential {:.1} ms, parallel {:.1} ms, speedup {:.2}x",
        ms(sequential),
        ms(parallel),
        ms(sequential) / ms(parallel)
    );

    println!("\n6. whole offload processes (release build), median of 21");
    let exe = std::env::current_exe().unwrap();
    let release = exe.parent().and_then(Path::parent).unwrap().to_path_buf();
    let offload = release.join("offload");
    if !offload.exists() {
        println!(
            "   skipped: {} does not exist (run `cargo build --release --workspace` first)",
            offload.display()
        );
    } else {
        let so = dir.join("saxpy.so");
        let s = Command::new("clang-19")
            .args([
                "-O2",
                "-fPIC",
                "-shared",
                "-I",
                repo().join("include").to_str().unwrap(),
            ])
            .arg(repo().join("kernels/saxpy.c"))
            .arg("-o")
            .arg(&so)
            .status()
            .unwrap();
        assert!(s.success());
        let host_bc = clang_bitcode(&TARGETS[2], "saxpy", &dir);
        let run_args = |image: &Path| -> Vec<String> {
            [
                "run",
                image.to_str().unwrap(),
                "--kernel",
                "saxpy",
                "--grid",
                "4",
                "--block",
                "256",
                "--arg",
                "i32:1024",
                "--arg",
                "f32:2",
                "--arg",
                "buf:f32:1024:iota",
                "--arg",
                "buf:f32:1024:fill=1",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect()
        };
        let native = run_args(&so);
        let native: Vec<&str> = native.iter().map(String::as_str).collect();
        let bitcode = run_args(&host_bc);
        let bitcode: Vec<&str> = bitcode.iter().map(String::as_str).collect();
        let baseline = std::env::var_os("OFFLOAD_BENCH_BASELINE").map(PathBuf::from);
        let cases: [(&str, &[&str]); 4] = [
            ("offload --help", &["--help"]),
            ("offload info", &["info"]),
            ("offload run saxpy.so (native)", &native),
            ("offload run saxpy.bc (JIT, cold)", &bitcode),
        ];
        println!(
            "   {:<36} {:>10} {:>12} {:>8}",
            "process", "now ms", "baseline ms", "ratio"
        );
        for (name, args) in cases {
            let now = process_time(&offload, args, &[], 21);
            let before = baseline.as_ref().map(|b| process_time(b, args, &[], 21));
            match before {
                Some(b) => println!(
                    "   {:<36} {:>10.2} {:>12.2} {:>7.2}x",
                    name,
                    ms(now),
                    ms(b),
                    ms(b) / ms(now)
                ),
                None => println!("   {:<36} {:>10.2} {:>12} {:>8}", name, ms(now), "-", "-"),
            }
        }
        if baseline.is_none() {
            println!(
                "   (set OFFLOAD_BENCH_BASELINE to an older build's offload binary for the baseline column)"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
