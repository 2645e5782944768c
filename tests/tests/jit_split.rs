//! Large host modules are compiled in parts on several threads (`crates/offload-jit/src/
//! split.rs`): simplified whole, split, each part optimised and compiled on its own thread, the
//! objects joined with `ld.lld -r`. A generated module large enough to split, with what a
//! split has to get right across parts (helpers called from kernels in other parts, a constant
//! table and a written global shared by kernels, a kernel that reads what another wrote), must
//! give, bit for bit, what the shared object clang makes gives, both split and compiled on one
//! thread; small modules must not be split.

use offload::{KernelArg, LaunchDims};
use offload_core::rand::XorShift;
use offload_tests::*;
use std::path::Path;

const HELPERS: u64 = 24;

/// One statement on the kernel's `v` and `w` (unsigned: no undefined behaviour that two
/// compiles could resolve differently).
fn statement(r: &mut XorShift) -> String {
    let c = (r.next_u64() as u32) | 1;
    let s = 1 + r.next_u64() % 31;
    match r.next_u64() % 10 {
        0 => format!("v = v * {c}u + w;"),
        1 => format!("v ^= v >> {s};"),
        2 => format!("v = mix{}(v, {c}u);", r.next_u64() % HELPERS),
        3 => "v += table[v & 63];".into(),
        4 => format!("for (unsigned j = 0; j < (v & 7); ++j) w = w * 3u + j + (v >> {s});"),
        5 => format!("if (v & {}u) w += v; else v -= w;", 1u32 << (s % 8)),
        6 => format!("v = (v << {s}) | (v >> {});", 32 - s),
        7 => "v /= (w | 1u);".into(),
        8 => format!("w = v % {c}u + counts[w & 15];"),
        _ => format!("w ^= mix{}(w, v);", r.next_u64() % HELPERS),
    }
}

/// `kernels` kernels `k0..` of `statements` statements each, the helpers `mix*` they call,
/// `set_counts`, which writes the global `counts`, and `get_counts`, which reads it.
fn source(seed: u64, kernels: usize, statements: usize) -> String {
    let mut r = XorShift(seed);
    let mut s = String::from("#include \"offload_kernel.h\"\n");
    let table: Vec<String> = (0..64)
        .map(|_| format!("{}u", r.next_u64() as u32))
        .collect();
    s.push_str(&format!(
        "static const unsigned table[64] = {{{}}};\nunsigned counts[16];\n",
        table.join(", ")
    ));
    for h in 0..HELPERS {
        let (a, b) = (r.next_u64() as u32 | 1, 1 + r.next_u64() % 31);
        s.push_str(&format!(
            "__attribute__((noinline)) static unsigned mix{h}(unsigned v, unsigned c) {{\n  \
             for (unsigned i = 0; i < (c & 3) + 1; ++i) v = (v ^ (v >> {b})) * {a}u + c + table[(v + i) & 63];\n  \
             return v;\n}}\n"
        ));
    }
    s.push_str(
        "OFFLOAD_KERNEL void set_counts(const unsigned *x) {\n  \
         unsigned i = offload_global_id_x();\n  if (i < 16) counts[i] = x[i] * 7u + 1u;\n}\n\
         OFFLOAD_KERNEL void get_counts(unsigned *out) {\n  \
         unsigned i = offload_global_id_x();\n  if (i < 16) out[i] = counts[i];\n}\n",
    );
    for k in 0..kernels {
        let body: Vec<String> = (0..statements).map(|_| statement(&mut r)).collect();
        s.push_str(&format!(
            "OFFLOAD_KERNEL void k{k}(unsigned n, unsigned seed, const unsigned *x, unsigned *out) {{\n  \
             unsigned i = offload_global_id_x();\n  if (i >= n) return;\n  \
             unsigned v = x[i] ^ seed, w = seed + i;\n  {}\n  out[i] = v ^ w;\n}}\n",
            body.join("\n  ")
        ));
    }
    s
}

fn words(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn launch(program: &offload::Program, name: &str, items: u32, args: &[KernelArg]) {
    let kernel = program.kernel(name).unwrap();
    let dims = LaunchDims {
        grid: [items.div_ceil(64), 1, 1],
        block: [64, 1, 1],
        shared_mem_bytes: 0,
    };
    // SAFETY: every pointer argument is a buffer of at least `items` words (16 for the
    // `counts` kernels, which touch 16), and the kernels stop at `n`.
    unsafe { kernel.launch(dims).args_raw(args).unchecked().run() }.unwrap();
}

/// Runs every kernel of one image (`kernels` of them) on the same inputs; returns each
/// kernel's output, the `counts` kernels' last.
fn run_all(device: &offload::Device, image: &Path, kernels: usize, seed: u64) -> Vec<Vec<u8>> {
    const N: u32 = 300;
    let program = offload_tests::load(device, &std::fs::read(image).unwrap()).unwrap();
    let mut r = XorShift(seed);
    let input: Vec<u32> = (0..N + 20).map(|_| r.next_u64() as u32).collect();
    let x = device.alloc_buffer(u64::from(N + 20) * 4).unwrap();
    x.write(&words(&input)).unwrap();
    let out = device.alloc_buffer(u64::from(N + 20) * 4).unwrap();
    let mut results = Vec::new();
    for k in 0..kernels {
        out.write(&vec![0xa5; (N as usize + 20) * 4]).unwrap();
        let args = [
            KernelArg::U32(N),
            KernelArg::U32(r.next_u64() as u32),
            KernelArg::Ptr(x.ptr()),
            KernelArg::Ptr(out.ptr()),
        ];
        launch(&program, &format!("k{k}"), N + 20, &args);
        let mut got = vec![0u8; (N as usize + 20) * 4];
        out.read(&mut got).unwrap();
        results.push(got);
    }
    launch(&program, "set_counts", 16, &[KernelArg::Ptr(x.ptr())]);
    launch(&program, "get_counts", 16, &[KernelArg::Ptr(out.ptr())]);
    let mut got = vec![0u8; 64];
    out.slice(..64).unwrap().read(&mut got).unwrap();
    results.push(got);
    results
}

/// The parts the compile logged (`OFFLOAD_DEBUG`'s compile phases), 1 when it did not split.
fn parts_logged(o: &std::process::Output) -> usize {
    let log = stderr(o);
    log.lines()
        .find_map(|l| {
            let (_, rest) = l.split_once("compile phase split into ")?;
            rest.split(' ').next()?.parse().ok()
        })
        .unwrap_or(1)
}

#[test]
fn a_split_module_runs_like_the_shared_object_and_the_unsplit_compile() {
    // About 60k instructions once the JIT has made the work-group functions: 2 parts of at
    // least MIN_PER_PART (20k) each on two threads, 3 on three.
    const KERNELS: usize = 150;
    let seed = 0x5911_7001;
    let src = source(seed, KERNELS, 24);
    let (so, bc) = host_kernel_from_source("split", &src);
    let dir = scratch("jit-split");
    let rt = host_runtime();
    let device = rt.device("host", 0).unwrap();
    let want = run_all(&device, &so, KERNELS, seed);
    for threads in [1usize, 3] {
        let out = dir.join(format!("split-{threads}.so"));
        let started = std::time::Instant::now();
        let o = host_jit(
            &bc,
            "x86-64-v3",
            &out,
            &[
                ("OFFLOAD_JIT_CODEGEN_THREADS", &threads.to_string()),
                ("OFFLOAD_DEBUG", "1"),
            ],
        );
        eprintln!(
            "{threads} thread(s): {} part(s), {:.1} s",
            parts_logged(&o),
            started.elapsed().as_secs_f64()
        );
        assert_eq!(
            parts_logged(&o),
            threads,
            "OFFLOAD_JIT_CODEGEN_THREADS={threads}: the compile made another number of parts \
             than the threads allow; log:\n{}",
            stderr(&o)
        );
        let got = run_all(&device, &out, KERNELS, seed);
        for (k, (w, g)) in want.iter().zip(&got).enumerate() {
            let name = if k == KERNELS {
                "set_counts/get_counts".to_string()
            } else {
                format!("k{k}")
            };
            assert!(
                w == g,
                "{name} compiled in {threads} part(s) differs from the shared object; source \
                 in {}",
                so.with_extension("c").display()
            );
        }
    }
}

#[test]
fn small_modules_are_not_split() {
    let bc = host_bitcode("saxpy");
    let out = scratch("jit-split-small").join("saxpy.so");
    let o = host_jit(
        &bc,
        "x86-64-v3",
        &out,
        &[("OFFLOAD_JIT_CODEGEN_THREADS", "8"), ("OFFLOAD_DEBUG", "1")],
    );
    assert!(
        stderr(&o).contains("compile phase optimize"),
        "no compile phases in the log:\n{}",
        stderr(&o)
    );
    assert_eq!(parts_logged(&o), 1, "saxpy was split:\n{}", stderr(&o));
}

#[test]
fn a_bad_thread_count_is_refused_by_name() {
    let bc = host_bitcode("saxpy");
    let out = scratch("jit-split-bad").join("saxpy.so");
    for bad in ["0", "65", "many", "-1"] {
        let o = host_jit_run(
            &bc,
            "x86-64-v3",
            &out,
            &[("OFFLOAD_JIT_CODEGEN_THREADS", bad)],
        );
        assert!(
            !o.status.success(),
            "OFFLOAD_JIT_CODEGEN_THREADS={bad} was accepted"
        );
        assert!(
            stderr(&o).contains("OFFLOAD_JIT_CODEGEN_THREADS"),
            "the error for {bad} does not name the variable:\n{}",
            stderr(&o)
        );
    }
}
