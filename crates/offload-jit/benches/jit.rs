//! JIT engine benchmark. Every number is printed next to a reference measured in the same run:
//!
//! 1. cold in-process compile vs `opt-19 -O3 | llc-19 -O3` as processes (plus `ld.lld-19` for
//!    the host, whose plugin loads a linked shared object), on small kernels (clang-19 output
//!    of `kernels/*.c`) and on one large generated module (≥ 1 MB of bitcode);
//! 2. warm cache-hit latency for a 1 MiB and a 16 MiB image next to the time to hash those
//!    bytes once with BLAKE3 (a hit costs one hash of the image plus a map lookup);
//! 3. the compile count when 16 threads ask for the same key at once (single flight);
//! 4. the speedup of compiling two different images from two threads over compiling them one
//!    after the other (upstream serialises all compiles of a plugin).
//!
//!     cargo bench -p offload-jit --bench jit

use inkwell::context::Context;
use inkwell::memory_buffer::MemoryBuffer;
use offload_jit::{JitConfig, JitEngine, JitTarget, LinkSharedObject, PostProcess, Unchanged};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

fn post(t: &Target) -> Box<dyn PostProcess> {
    if t.link {
        Box::new(LinkSharedObject::host().unwrap())
    } else {
        Box::new(Unchanged)
    }
}

fn engine_compile(t: &Target, image: &[u8]) -> Duration {
    // A fresh engine per measurement: a cold cache.
    let engine = JitEngine::with_config(t.triple, JitConfig::default()).unwrap();
    let target = JitTarget {
        compute_unit_kind: t.cpu.into(),
        features: String::new(),
    };
    let p = post(t);
    let started = Instant::now();
    engine.compile(image, &target, p.as_ref()).unwrap();
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
    let mut x = seed | 1;
    let data: Vec<u8> = (0..bytes)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    let value = context.const_string(&data, false);
    let global = module.add_global(value.get_type(), None, "table");
    global.set_initializer(&value);
    global.set_constant(true);
    module.write_bitcode_to_memory().as_slice().to_vec()
}

fn main() {
    let dir = scratch();
    println!(
        "offload-jit benchmark ({} cores)\n",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );

    println!(
        "1. cold compile: in-process engine vs opt-19 -O3 | llc-19 -O3 (+ ld.lld-19 for the host), median of 5"
    );
    println!(
        "   {:<28} {:>12} {:>12} {:>8}",
        "input", "engine ms", "tools ms", "ratio"
    );
    for t in &TARGETS {
        for k in ["saxpy", "stencil2d", "args16"] {
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
            let image = std::fs::read(&bc).unwrap();
            let ours = median((0..5).map(|_| engine_compile(t, &image)).collect());
            let theirs = median(
                (0..5)
                    .map(|_| tools_compile(t, &bc, &dir.join("out.so")))
                    .collect(),
            );
            println!(
                "   {:<28} {:>12.2} {:>12.2} {:>7.1}x",
                format!("{k} ({})", t.name),
                ms(ours),
                ms(theirs),
                ms(theirs) / ms(ours)
            );
        }
    }
    let large = large_module(6000);
    let large_path = dir.join("large.bc");
    std::fs::write(&large_path, &large).unwrap();
    let host = &TARGETS[2];
    let ours = engine_compile(host, &large);
    let theirs = tools_compile(host, &large_path, &dir.join("large.so"));
    println!(
        "   {:<28} {:>12.1} {:>12.1} {:>7.2}x",
        format!(
            "large module ({:.2} MB bc, 6000 fns, host)",
            large.len() as f64 / 1e6
        ),
        ms(ours),
        ms(theirs),
        ms(theirs) / ms(ours)
    );

    println!("\n2. warm cache hit vs one BLAKE3 hash of the same bytes (mean of 50)");
    println!(
        "   {:<14} {:>12} {:>12} {:>8}",
        "image", "hit ms", "hash ms", "ratio"
    );
    for mib in [1usize, 16] {
        let image = data_module(mib << 20, mib as u64);
        let engine = JitEngine::with_config(host.triple, JitConfig::default()).unwrap();
        let target = JitTarget {
            compute_unit_kind: "x86-64".into(),
            features: String::new(),
        };
        engine.compile(&image, &target, &Unchanged).unwrap();
        let n = 50;
        let t = Instant::now();
        for _ in 0..n {
            let out = engine.compile(&image, &target, &Unchanged).unwrap();
            assert_eq!(out.served, offload_jit::Served::MemoryHit);
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

    println!("\n3. single flight: 16 threads request the same key at once");
    let engine = Arc::new(JitEngine::with_config(host.triple, JitConfig::default()).unwrap());
    let image = Arc::new(large_module(300));
    let barrier = Arc::new(std::sync::Barrier::new(16));
    let handles: Vec<_> = (0..16)
        .map(|_| {
            let (engine, image, barrier) = (engine.clone(), image.clone(), barrier.clone());
            std::thread::spawn(move || {
                let target = JitTarget {
                    compute_unit_kind: "x86-64".into(),
                    features: String::new(),
                };
                barrier.wait();
                engine.compile(&image, &target, &Unchanged).unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let st = engine.stats();
    println!(
        "   compiles: {} (requests: 16; served from memory: {}, waited for the shared compile: {})",
        st.compiles, st.memory_hits, st.shared_waits
    );

    println!("\n4. two different images: sequential vs two threads (fresh engines, median of 3)");
    let a = large_module(700);
    let b = large_module(701);
    let target = JitTarget {
        compute_unit_kind: "x86-64".into(),
        features: String::new(),
    };
    let sequential = median(
        (0..3)
            .map(|_| {
                let e = JitEngine::with_config(host.triple, JitConfig::default()).unwrap();
                let t = Instant::now();
                e.compile(&a, &target, &Unchanged).unwrap();
                e.compile(&b, &target, &Unchanged).unwrap();
                t.elapsed()
            })
            .collect(),
    );
    let mut peak = 0;
    let parallel = median(
        (0..3)
            .map(|_| {
                let e = JitEngine::with_config(host.triple, JitConfig::default()).unwrap();
                let t = Instant::now();
                std::thread::scope(|s| {
                    s.spawn(|| e.compile(&a, &target, &Unchanged).unwrap());
                    s.spawn(|| e.compile(&b, &target, &Unchanged).unwrap());
                });
                peak = peak.max(e.stats().peak_in_flight);
                t.elapsed()
            })
            .collect(),
    );
    println!(
        "   sequential {:.1} ms, parallel {:.1} ms, speedup {:.2}x (most compiles in flight at once: {peak})",
        ms(sequential),
        ms(parallel),
        ms(sequential) / ms(parallel)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
