//! Kernels with barriers, generated at random: the bitcode path (the JIT's region form of the
//! work-group function) gives, bit for bit, what the shared object gives (fibers, one per work
//! item). The kernels mix barriers inside uniform loops and branches, values and private arrays
//! that live across barriers, block-shared exchanges, branches that differ per work item
//! between barriers, and early returns after the last barrier.
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
}

impl Gen {
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
                5 => format!("priv[{}]", self.rng.below(8)),
                _ => format!("v{}", self.rng.below(VARS as u64)),
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
            _ => format!("sh[t] + {a}"),
        }
    }

    /// A statement; with `barriers` it may contain barriers (so every work item must reach it).
    fn stmt(&mut self, depth: u32, barriers: bool) {
        let v = self.rng.below(VARS as u64);
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
            1 => {
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
            2 => {
                let e = self.expr(2);
                self.line(&format!("v{v} ^= {e};"));
            }
            3 | 4 => {
                // A loop every work item runs the same number of times.
                let bound = match self.rng.below(4) {
                    0 => format!("{}u", 1 + self.rng.below(3)),
                    1 => "B % 3u + 1u".into(),
                    2 => "(unsigned)n % 4u".into(),
                    _ => "b % 2u + 1u".into(),
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
    program
        .launch(
            kernel,
            &dims,
            &[
                KernelArg::Ptr(inb.ptr()),
                KernelArg::Ptr(outb.ptr()),
                KernelArg::I32(n as i32),
            ],
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut out = vec![0u8; items * 4];
    outb.read(&mut out).unwrap();
    out
}

#[test]
fn random_barrier_kernels_give_the_same_results_from_bitcode_and_shared_objects() {
    let seeds: Vec<u64> = match std::env::var("OFFLOAD_TEST_SEED") {
        Ok(s) => vec![s.parse().expect("OFFLOAD_TEST_SEED: an integer")],
        Err(_) => (1..=3).collect(),
    };
    const KERNELS: usize = 12;
    for seed in seeds {
        let mut g = Gen {
            rng: Rng(seed),
            out: "#include \"offload_kernel.h\"\n".into(),
            indent: 0,
            loops: 0,
        };
        for k in 0..KERNELS {
            g.kernel(&format!("k{k}"), k % 4);
        }
        let tag = format!("regions-{seed}");
        let dir = scratch("host-regions");
        let c = dir.join(format!("{tag}.c"));
        std::fs::write(&c, &g.out).unwrap();
        let include = repo_root().join("include");
        let so = dir.join(format!("{tag}.so"));
        let bc = dir.join(format!("{tag}.bc"));
        // Even seeds unoptimised (every variable a stack slot), odd ones at -O2.
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

        // Every kernel has its work-group function (else this would compare fibers with
        // fibers).
        let jitted = dir.join(format!("{tag}.jit.so"));
        let o = offload(
            &[
                "jit",
                bc.to_str().unwrap(),
                "--target",
                "x86_64-unknown-linux-gnu",
                "--cpu",
                "x86-64",
                "-o",
                jitted.to_str().unwrap(),
            ],
            &[],
        );
        assert!(o.status.success(), "{}", stderr(&o));
        let bytes = std::fs::read(&jitted).unwrap();
        for k in 0..KERNELS {
            let sym = format!("__offload_wg_k{k}\0");
            assert!(
                bytes.windows(sym.len()).any(|w| w == sym.as_bytes()),
                "seed {seed}: no work-group function for k{k} (source: {})",
                c.display()
            );
        }

        let rt = host_runtime();
        let device = rt.device("host", 0).unwrap();
        let from_so = device.load(&std::fs::read(&so).unwrap()).unwrap();
        let from_bc = device.load(&std::fs::read(&bc).unwrap()).unwrap();
        for k in 0..KERNELS {
            let name = format!("k{k}");
            for items in [1u32, 8, 36, 64, 256] {
                let Some(block) = block_of(k % 4, items) else {
                    continue;
                };
                let want = run(&from_so, &device, &name, k % 4, block);
                let got = run(&from_bc, &device, &name, k % 4, block);
                assert!(
                    want == got,
                    "seed {seed}, kernel {name}, block {block:?}: bitcode and shared object differ \
                     (source: {})",
                    c.display()
                );
            }
        }
    }
}
