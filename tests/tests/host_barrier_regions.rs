//! Kernels with barriers, generated at random: the bitcode path (the JIT's region form of the
//! work-group function) gives, bit for bit, what the shared object gives (fibers, one per work
//! item). The kernels mix barriers inside uniform loops and branches, values and private arrays
//! that live across barriers, block-shared exchanges, branches that differ per work item
//! between barriers, and early returns after the last barrier. Barrier-free kernels with loops
//! check the JIT's implicit loop barriers the same way.
//!
//! Even seeds are compiled unoptimised (every variable a stack slot), odd ones at -O2.
//! `OFFLOAD_TEST_SEED=N` reruns one seed; a failure prints the seed and the kernel's source.

use offload::{KernelArg, LaunchDims};
use offload_tests::*;
use std::fmt::Write as _;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const VARS: usize = 4;

struct Gen {
    rng: Rng,
    out: String,
    indent: usize,
    loops: usize,
    /// Expressions may read the private array and block-shared memory (off in some
    /// barrier-free kernels, whose loops the JIT then interleaves only when nothing lives in
    /// memory per work item).
    privs: bool,
    shared: bool,
    /// How many of the variables `v0`.. statements use (fewer in barrier-free kernels, where
    /// many values live across a loop's head make the JIT keep the plain loop).
    vars: u64,
}

impl Gen {
    fn var(&mut self) -> u64 {
        self.rng.below(self.vars)
    }

    fn line(&mut self, s: &str) {
        let _ = writeln!(self.out, "{}{s}", "  ".repeat(self.indent));
    }

    fn expr(&mut self, depth: u32) -> String {
        let leaf = depth == 0 || self.rng.below(3) == 0;
        if leaf {
            return match self.rng.below(7) {
                0 => "t".into(),
                1 => "B".into(),
                2 => "b".into(),
                3 => format!("{}u", self.rng.below(1000)),
                4 if self.loops > 0 => format!("i{}", self.rng.below(self.loops as u64)),
                5 if self.privs => format!("priv[{}]", self.rng.below(8)),
                6 => format!("in[(v{} + t) % (unsigned)n]", self.var()),
                _ => format!("v{}", self.var()),
            };
        }
        let a = self.expr(depth - 1);
        let b = self.expr(depth - 1);
        match self.rng.below(6) {
            0 => format!("({a} + {b})"),
            1 => format!("({a} * {}u)", 1 + 2 * self.rng.below(8)),
            2 => format!("({a} ^ {b})"),
            3 => format!("({a} >> {}u)", self.rng.below(5)),
            4 => format!("({a} < {b} ? {a} : {b})"),
            5 if self.shared => format!("sh[t] + {a}"),
            _ => format!("({a} - {b})"),
        }
    }

    /// A statement; with `barriers` it may contain barriers (so every work item must reach it).
    fn stmt(&mut self, depth: u32, barriers: bool) {
        let v = self.var();
        let kind = if depth == 0 {
            self.rng.below(3)
        } else {
            self.rng.below(8)
        };
        match kind {
            0 => {
                let e = self.expr(3);
                self.line(&format!("v{v} = {e};"));
            }
            1 if self.privs => {
                let i = self.expr(2);
                let e = self.expr(3);
                self.line(&format!("priv[({i}) & 7u] = {e};"));
            }
            2 if barriers => {
                // An exchange through block-shared memory: write my slot, barrier, read
                // another's, barrier (before anyone writes again).
                let e = self.expr(3);
                let c = self.rng.below(64);
                self.line(&format!("sh[t] = {e};"));
                self.line("offload_barrier();");
                self.line(&format!("v{v} += sh[(t + {c}u) % B];"));
                self.line("offload_barrier();");
            }
            1 | 2 => {
                let e = self.expr(2);
                self.line(&format!("v{v} ^= {e};"));
            }
            3 | 4 => {
                // A loop every work item runs the same number of times; without barriers
                // also loops whose trip counts differ per work item (and change as the loop
                // runs).
                let choices = if barriers { 4 } else { 8 };
                let bound = match self.rng.below(choices) {
                    0 => format!("{}u", 1 + self.rng.below(3)),
                    1 => "B % 3u + 1u".into(),
                    2 => "(unsigned)n % 4u".into(),
                    3 => "b % 2u + 1u".into(),
                    4 => "t % 3u + 1u".into(),
                    5 => format!("(v{} & 3u)", self.var()),
                    6 => "in[t % (unsigned)n] % 3u".into(),
                    _ => "(unsigned)n % 7u + 2u".into(),
                };
                let i = self.loops;
                self.line(&format!(
                    "for (unsigned i{i} = 0; i{i} < {bound}; ++i{i}) {{"
                ));
                self.loops += 1;
                self.block(depth - 1, barriers);
                self.loops -= 1;
                self.line("}");
            }
            5 => {
                // A branch the same for the whole block: barriers allowed on both sides.
                let c = self.rng.below(3);
                self.line(&format!("if ((b + {c}u) % 3u == 0u) {{"));
                self.block(depth - 1, barriers);
                self.line("} else {");
                self.block(depth - 1, barriers);
                self.line("}");
            }
            6 => {
                // A branch that differs per work item: no barrier inside.
                let e = self.expr(2);
                self.line(&format!("if (({e}) & 1u) {{"));
                self.block(depth - 1, false);
                self.line("}");
            }
            _ => {
                // A loop left by a uniform break.
                let k = 1 + self.rng.below(3);
                let w = self.loops;
                self.line(&format!("for (unsigned i{w} = 0;; ++i{w}) {{"));
                self.loops += 1;
                self.block(depth - 1, barriers);
                if !barriers && self.rng.below(2) == 0 {
                    // Left early by some work items.
                    let v = self.var();
                    self.line(&format!("  if ((v{v} ^ i{w}) % 5u == 1u) break;"));
                }
                self.line(&format!("  if (i{w} + 1u >= {k}u) break;"));
                self.loops -= 1;
                self.line("}");
            }
        }
    }

    fn block(&mut self, depth: u32, barriers: bool) {
        self.indent += 1;
        for _ in 0..1 + self.rng.below(3) {
            self.stmt(depth, barriers);
        }
        self.indent -= 1;
    }

    /// Kernel `name`: `shape` 0 is 1-D with static shared memory, 1 is 1-D with dynamic
    /// shared memory, 2 is 2-D, 3 is 3-D.
    fn kernel(&mut self, name: &str, shape: usize) {
        self.line(&format!(
            "OFFLOAD_KERNEL void {name}(const unsigned *in, unsigned *out, int n) {{"
        ));
        self.indent += 1;
        if shape == 1 {
            self.line("unsigned *sh = (unsigned *)offload_shared_memory();");
        } else {
            self.line("OFFLOAD_SHARED unsigned sh[1024];");
        }
        self.ids(shape);
        self.line("unsigned priv[8];");
        self.line("for (unsigned j = 0; j < 8u; ++j) priv[j] = t * j;");
        for v in 0..VARS {
            self.line(&format!(
                "unsigned v{v} = in[(b * B + t + {v}u) % (unsigned)n];"
            ));
        }
        self.line("sh[t] = v0;");
        self.line("offload_barrier();");
        self.indent -= 1;
        self.block(3, true);
        self.indent += 1;
        self.line("if ((t & 7u) == 5u && (v1 & 1u)) return;");
        self.line("out[b * B + t] = v0 ^ v1 * 3u ^ v2 * 5u ^ v3 * 7u ^ priv[t & 7u] ^ sh[t];");
        self.indent -= 1;
        self.line("}");
    }
}

impl Gen {
    /// Barrier-free kernel `name` of `shape` (as for `kernel`, without shared memory): loops
    /// whose trip counts may differ per work item, breaks taken by some work items, and
    /// perhaps an early return before them; with `privs` a private array as well.
    fn loop_kernel(&mut self, name: &str, shape: usize, privs: bool) {
        self.privs = privs;
        self.shared = false;
        self.vars = 1 + self.rng.below(VARS as u64);
        self.line(&format!(
            "OFFLOAD_KERNEL void {name}(const unsigned *in, unsigned *out, int n) {{"
        ));
        self.indent += 1;
        self.ids(shape);
        if privs {
            self.line("unsigned priv[8];");
            self.line("for (unsigned j = 0; j < 8u; ++j) priv[j] = t * j;");
        }
        for v in 0..VARS {
            self.line(&format!(
                "unsigned v{v} = in[(b * B + t + {v}u) % (unsigned)n];"
            ));
        }
        if self.rng.below(3) == 0 {
            self.line("if ((t & 7u) == 3u && (v2 & 1u)) { out[b * B + t] = v0; return; }");
        }
        for _ in 0..1 + self.rng.below(3) {
            if self.rng.below(3) == 0 {
                self.stmt(2, false);
            } else {
                self.top_loop();
            }
        }
        let p = if privs { " ^ priv[t & 7u]" } else { "" };
        self.line(&format!(
            "out[b * B + t] = v0 ^ v1 * 3u ^ v2 * 5u ^ v3 * 7u{p};"
        ));
        self.indent -= 1;
        self.line("}");
        self.privs = true;
        self.shared = true;
        self.vars = VARS as u64;
    }

    /// A loop at the kernel's top level whose trip count is the same for the whole block but
    /// known only at run time (what the JIT interleaves), sometimes inside a branch that
    /// differs per work item or left early by some work items (what makes them part ways).
    fn top_loop(&mut self) {
        let divergent_entry = self.rng.below(4) == 0;
        if divergent_entry {
            let v = self.var();
            self.line(&format!("if ((v{v} + t) % 3u != 1u) {{"));
            self.indent += 1;
        }
        let bound = match self.rng.below(3) {
            0 => "(unsigned)n % 7u + 2u",
            1 => "B % 5u + 3u",
            _ => "(unsigned)n % 3u + b % 2u + 1u",
        };
        let i = self.loops;
        self.line(&format!(
            "for (unsigned i{i} = 0; i{i} < {bound}; ++i{i}) {{"
        ));
        self.loops += 1;
        // Values carried from iteration to iteration (else the optimiser keeps only the last
        // iteration and no loop is left).
        for _ in 0..1 + self.rng.below(2) {
            let (v, w) = (self.var(), self.var());
            let (c, m) = (1 + self.rng.below(9), 1 + 2 * self.rng.below(8));
            self.line(&format!(
                "  v{v} += in[(v{w} + i{i} * {c}u + t) % (unsigned)n] * {m}u;"
            ));
        }
        if self.rng.below(2) == 0 {
            let depth = self.rng.below(2) as u32;
            self.block(depth, false);
        }
        if self.rng.below(5) == 0 {
            let v = self.var();
            self.line(&format!("  if ((v{v} ^ i{i}) % 7u == 2u) break;"));
        }
        self.loops -= 1;
        self.line("}");
        if divergent_entry {
            self.indent -= 1;
            self.line("}");
        }
    }

    fn ids(&mut self, shape: usize) {
        match shape {
            2 => {
                self.line("unsigned t = offload_thread_id(0) + offload_thread_id(1) * offload_block_dim(0);");
                self.line("unsigned B = offload_block_dim(0) * offload_block_dim(1);");
            }
            3 => {
                self.line("unsigned t = offload_thread_id(0) + offload_block_dim(0) * (offload_thread_id(1) + offload_block_dim(1) * offload_thread_id(2));");
                self.line("unsigned B = offload_block_dim(0) * offload_block_dim(1) * offload_block_dim(2);");
            }
            _ => self.line("unsigned t = offload_thread_id(0), B = offload_block_dim(0);"),
        }
        self.line("unsigned b = offload_block_id(0);");
    }
}

/// The block of `items` work items for `shape` (see `Gen::kernel`).
fn block_of(shape: usize, items: u32) -> Option<[u32; 3]> {
    match shape {
        2 if items % 4 == 0 => Some([items / 4, 4, 1]),
        3 if items % 8 == 0 => Some([items / 8, 4, 2]),
        0 | 1 => Some([items, 1, 1]),
        _ => None,
    }
}

fn run(
    program: &offload::Program,
    device: &offload::Device,
    name: &str,
    shape: usize,
    block: [u32; 3],
) -> Vec<u8> {
    let n = 1000usize;
    let input: Vec<u8> = (0..n as u32)
        .flat_map(|i| i.wrapping_mul(2_654_435_761).to_le_bytes())
        .collect();
    let grid = 3u32;
    let items = (grid * block.iter().product::<u32>()) as usize;
    let inb = device.alloc_buffer(input.len() as u64).unwrap();
    inb.write(&input).unwrap();
    let outb = device.alloc_buffer(items as u64 * 4).unwrap();
    outb.write(&vec![0xa5; items * 4]).unwrap();
    let kernel = program.kernel(name).unwrap();
    let dims = LaunchDims {
        grid: [grid, 1, 1],
        block,
        shared_mem_bytes: if shape == 1 { 4096 } else { 0 },
    };
    // SAFETY: the buffers are as long as the kernel touches for these arguments.
    unsafe {
        kernel
            .launch(dims)
            .args_raw(&[
                KernelArg::Ptr(inb.ptr()),
                KernelArg::Ptr(outb.ptr()),
                KernelArg::I32(n as i32),
            ])
            .unchecked()
            .run()
    }
    .unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut out = vec![0u8; items * 4];
    outb.read(&mut out).unwrap();
    out
}

fn seeds() -> Vec<u64> {
    match std::env::var("OFFLOAD_TEST_SEED") {
        Ok(s) => vec![s.parse().expect("OFFLOAD_TEST_SEED: an integer")],
        Err(_) => (1..=3).collect(),
    }
}

fn generator(seed: u64) -> Gen {
    Gen {
        rng: Rng(seed),
        out: "#include \"offload_kernel.h\"\n".into(),
        indent: 0,
        loops: 0,
        privs: true,
        shared: true,
        vars: VARS as u64,
    }
}

/// Compiles `source` to a shared object and to bitcode (even seeds unoptimised, every
/// variable a stack slot; odd ones at -O2), and JITs the bitcode for the host; returns the
/// shared object, the bitcode, the JIT's shared object's bytes and the source's path.
fn build(seed: u64, tag: &str, source: &str) -> (Vec<u8>, Vec<u8>, Vec<u8>, std::path::PathBuf) {
    let dir = scratch("host-regions");
    let c = dir.join(format!("{tag}.c"));
    std::fs::write(&c, source).unwrap();
    let include = repo_root().join("include");
    let so = dir.join(format!("{tag}.so"));
    let bc = dir.join(format!("{tag}.bc"));
    let opt = if seed % 2 == 0 { "-O0" } else { "-O2" };
    let common = [opt, "-fPIC", "-w", "-I", include.to_str().unwrap()];
    let mut a: Vec<&str> = common.to_vec();
    a.extend(["-shared", c.to_str().unwrap(), "-o", so.to_str().unwrap()]);
    clang(&a);
    let mut a: Vec<&str> = common.to_vec();
    a.extend([
        "-emit-llvm",
        "-c",
        c.to_str().unwrap(),
        "-o",
        bc.to_str().unwrap(),
    ]);
    clang(&a);
    let jitted = dir.join(format!("{tag}.jit.so"));
    host_jit(&bc, "x86-64", &jitted, &[]);
    (
        std::fs::read(&so).unwrap(),
        std::fs::read(&bc).unwrap(),
        std::fs::read(&jitted).unwrap(),
        c,
    )
}

fn has_symbol(bytes: &[u8], name: &str) -> bool {
    let sym = format!("{name}\0");
    bytes.windows(sym.len()).any(|w| w == sym.as_bytes())
}

/// Runs every kernel `(name, shape)` from both images on blocks of several sizes and shapes
/// and checks the outputs equal.
fn compare(seed: u64, so: &[u8], bc: &[u8], kernels: &[(String, usize)], c: &std::path::Path) {
    let rt = host_runtime();
    let device = rt.device("host", 0).unwrap();
    let from_so = offload_tests::load(&device, so).unwrap();
    let from_bc = offload_tests::load(&device, bc).unwrap();
    for (name, shape) in kernels {
        for items in [1u32, 8, 36, 64, 256] {
            let Some(block) = block_of(*shape, items) else {
                continue;
            };
            let want = run(&from_so, &device, name, *shape, block);
            let got = run(&from_bc, &device, name, *shape, block);
            assert!(
                want == got,
                "seed {seed}, kernel {name}, block {block:?}: bitcode and shared object differ \
                 (source: {})",
                c.display()
            );
        }
    }
}

#[test]
fn random_barrier_kernels_give_the_same_results_from_bitcode_and_shared_objects() {
    const KERNELS: usize = 12;
    for seed in seeds() {
        let mut g = generator(seed);
        let kernels: Vec<(String, usize)> =
            (0..KERNELS).map(|k| (format!("k{k}"), k % 4)).collect();
        for (name, shape) in &kernels {
            g.kernel(name, *shape);
        }
        let (so, bc, jitted, c) = build(seed, &format!("regions-{seed}"), &g.out);
        // Every kernel has its work-group function (else this would compare fibers with
        // fibers).
        for (name, _) in &kernels {
            assert!(
                has_symbol(&jitted, &format!("__offload_wg_{name}")),
                "seed {seed}: no work-group function for {name} (source: {})",
                c.display()
            );
        }
        compare(seed, &so, &bc, &kernels, &c);
    }
}

/// Barrier-free kernels with loops: the JIT may put implicit barriers at the heads of loops so
/// that the work items run each iteration together (and on alone when their trip counts
/// part); the results are those of the shared object, which runs each work item to its end.
#[test]
fn random_loop_kernels_give_the_same_results_with_implicit_barriers() {
    const KERNELS: usize = 16;
    for seed in seeds() {
        let mut g = generator(seed ^ 0x5eed);
        let kernels: Vec<(String, usize)> = (0..KERNELS)
            .map(|k| (format!("l{k}"), [0, 2, 3][k % 3]))
            .collect();
        for (k, (name, shape)) in kernels.iter().enumerate() {
            g.loop_kernel(name, *shape, k % 4 == 3);
        }
        let (so, bc, jitted, c) = build(seed, &format!("loops-{seed}"), &g.out);
        let interleaved = kernels
            .iter()
            .filter(|(name, _)| has_symbol(&jitted, &format!("__offload_wgf_{name}")))
            .count();
        for (name, _) in &kernels {
            assert!(
                has_symbol(&jitted, &format!("__offload_wg_{name}")),
                "seed {seed}: no work-group function for {name} (source: {})",
                c.display()
            );
        }
        // Optimised kernels keep their values in registers: some must take the interleaved
        // form, else this compares the plain loop with itself.
        if seed % 2 == 1 {
            assert!(
                interleaved >= 2,
                "seed {seed}: only {interleaved} of {KERNELS} kernels interleaved (source: {})",
                c.display()
            );
        }
        compare(seed, &so, &bc, &kernels, &c);
    }
}

/// A kernel with more loops than the JIT gives implicit barriers to keeps the plain loop nest
/// (hundreds of regions made LLVM's optimiser take tens of seconds), and its results.
#[test]
fn kernels_with_many_loops_keep_the_plain_loop_nest() {
    let mut src = String::from("#include \"offload_kernel.h\"\n");
    src.push_str("OFFLOAD_KERNEL void many(const unsigned *in, unsigned *out, int n) {\n");
    src.push_str(
        "  unsigned t = offload_thread_id(0), b = offload_block_id(0), B = offload_block_dim(0);\n",
    );
    src.push_str("  unsigned v = in[(b * B + t) % (unsigned)n];\n");
    for l in 0..12 {
        src.push_str(&format!(
            "  for (unsigned i = 0; i < (unsigned)n % {m}u + 2u; ++i) v += in[(v + i * {l}u + t) % (unsigned)n] * {k}u;\n",
            m = l + 3,
            k = 2 * l + 1
        ));
    }
    src.push_str("  out[b * B + t] = v;\n}\n");
    let (so, bc, jitted, c) = build(1, "many-loops", &src);
    assert!(has_symbol(&jitted, "__offload_wg_many"));
    assert!(
        !has_symbol(&jitted, "__offload_wgf_many"),
        "12 loops got implicit barriers (source: {})",
        c.display()
    );
    compare(1, &so, &bc, &[("many".to_string(), 0)], &c);
}
