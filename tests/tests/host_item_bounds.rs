//! The JIT turns guards on the work-item ID (`if (i < n)`, `if (x >= X || y >= Y) return;`)
//! into the bounds of the loop over a block's work items
//! (`crates/offload-jit/cpp/work_groups/item_bounds.cpp`). Generated kernels with every guard
//! shape the header allows (1-D, 2-D, 3-D IDs; unsigned, signed and 64-bit comparisons of all
//! six kinds; conjunctions, disjunctions, negations, several guards in a row; bounds from
//! arguments, constants and memory; offsets that wrap around within a block) must give, bit for
//! bit, what the shared object gives, which runs the kernel once per work item. Hand-written
//! kernels check that the common shapes really lose their masks.

use offload::{KernelArg, LaunchDims};
use offload_core::rand::XorShift;
use offload_tests::*;
use std::path::Path;

fn pick<'a, T>(r: &mut XorShift, from: &'a [T]) -> &'a T {
    &from[(r.next_u64() % from.len() as u64) as usize]
}

/// One comparison of a work-item expression with a bound.
fn atom(r: &mut XorShift) -> String {
    let value = *pick(
        r,
        &[
            "gx",
            "gx",
            "(int)gx",
            "(long)gx",
            "(size_t)gx",
            "gx + u",
            "(int)gx - n",
            "tx",
            "gy",
            "(int)gy",
            "gz",
            "gx + 3",
            "(unsigned short)(gx + u)",
            "(long)(gx + u)",
            "gx * 2",
            "gx ^ 1",
            "p[1]",
        ],
    );
    let op = *pick(r, &["<", "<=", ">", ">=", "==", "!=", "<", ">="]);
    let bound = *pick(
        r,
        &[
            "n",
            "m",
            "u",
            "l",
            "lim",
            "7",
            "(unsigned)n",
            "(long)m",
            "W",
            "bx * dx + 5",
        ],
    );
    format!("{value} {op} {bound}")
}

fn guard(r: &mut XorShift) -> String {
    let (a, b, c) = (atom(r), atom(r), atom(r));
    match r.next_u64() % 8 {
        0 => format!("if ({a}) return;"),
        1 => format!("if (!({a}) || {b}) return;"),
        2 => format!("if (!({a} && {b})) return;"),
        3 => format!("if ({a}) return;\n  if ({b}) return;"),
        4 => format!("if ({a} || {b} || {c}) return;"),
        5 => format!("if (!({a})) return;"),
        6 => format!("if (({a}) ? ({b}) : ({c})) return;"),
        _ => format!("if ({a}) return;\n  int q = p[1];\n  if (gx + q >= (unsigned)m) return;"),
    }
}

/// `count` kernels `k0..`, each with generated guards before its one store.
fn source(seed: u64, count: usize) -> String {
    let mut r = XorShift(seed);
    let mut s = String::from("#include <stddef.h>\n#include \"offload_kernel.h\"\n");
    for k in 0..count {
        let g = guard(&mut r);
        let write = if r.next_u64() % 3 == 0 {
            // The store in a branch of its own after the guards (`if (i < n) y[i] = ...`).
            format!(
                "if ({}) out[id] = 1 + (int)(gx * 3 + gy * 5 + gz * 7) ^ n;",
                atom(&mut r)
            )
        } else {
            "out[id] = 1 + (int)(gx * 3 + gy * 5 + gz * 7) ^ n;".to_string()
        };
        s.push_str(&format!(
            r#"
OFFLOAD_KERNEL void k{k}(int n, int m, unsigned u, long l, const int *p, int *out) {{
  unsigned tx = offload_thread_id(0), ty = offload_thread_id(1), tz = offload_thread_id(2);
  unsigned bx = offload_block_id(0), by = offload_block_id(1), bz = offload_block_id(2);
  unsigned dx = offload_block_dim(0), dy = offload_block_dim(1), dz = offload_block_dim(2);
  unsigned gx = bx * dx + tx, gy = by * dy + ty, gz = bz * dz + tz;
  unsigned W = offload_grid_dim(0) * dx, H = offload_grid_dim(1) * dy;
  unsigned id = (gz * H + gy) * W + gx;
  int lim = p[0];
  (void)ty; (void)tz; (void)l; (void)lim; (void)u;
  {g}
  {write}
}}
"#
        ));
    }
    s
}

/// Runs kernel `name` of `image` with the given scalars over `dims` and returns `out`.
fn launch(
    device: &offload::Device,
    program: &offload::Program,
    name: &str,
    dims: &LaunchDims,
    scalars: (i32, i32, u32, i64),
    memory: &[i32; 2],
) -> Vec<u8> {
    let items: u64 = (0..3)
        .map(|d| u64::from(dims.grid[d]) * u64::from(dims.block[d]))
        .product();
    let p = device.alloc_buffer(8).unwrap();
    let bytes: Vec<u8> = memory.iter().flat_map(|v| v.to_le_bytes()).collect();
    p.write(&bytes).unwrap();
    let out = device.alloc_buffer(items * 4).unwrap();
    let fill: Vec<u8> = (0..items * 4).map(|i| (i * 7) as u8).collect();
    out.write(&fill).unwrap();
    let kernel = program.kernel(name).unwrap();
    let (n, m, u, l) = scalars;
    let args = [
        KernelArg::I32(n),
        KernelArg::I32(m),
        KernelArg::U32(u),
        KernelArg::I64(l),
        KernelArg::Ptr(p.ptr()),
        KernelArg::Ptr(out.ptr()),
    ];
    // SAFETY: `out` has one int per work item of the launch (the largest `id`), `p` two.
    unsafe { kernel.launch(*dims).args_raw(&args).unchecked().run() }.unwrap();
    let mut result = vec![0u8; (items * 4) as usize];
    out.read(&mut result).unwrap();
    result
}

#[test]
fn generated_guards_give_the_shared_objects_results() {
    const KERNELS: usize = 48;
    let rt = host_runtime();
    let device = rt.device("host", 0).unwrap();
    for seed in [0x5eed_0001u64, 0x5eed_0002] {
        let src = source(seed, KERNELS);
        let (so, bc) = host_kernel_from_source(&format!("gen-{seed:x}"), &src);
        let so_p = offload_tests::load(&device, &std::fs::read(&so).unwrap()).unwrap();
        let bc_p = offload_tests::load(&device, &std::fs::read(&bc).unwrap()).unwrap();
        let mut r = XorShift(seed ^ 0x9e37_79b9_7f4a_7c15);
        for k in 0..KERNELS {
            for _ in 0..3 {
                let mut dim = |max_grid: u64, max_block: u64| {
                    (
                        1 + (r.next_u64() % max_grid) as u32,
                        1 + (r.next_u64() % max_block) as u32,
                    )
                };
                let (gx, bx) = dim(5, 70);
                let (gy, by) = dim(3, 4);
                let (gz, bz) = dim(2, 3);
                let dims = LaunchDims {
                    grid: [gx, gy, gz],
                    block: [bx, by, bz],
                    shared_mem_bytes: 0,
                };
                let small = |r: &mut XorShift| (r.next_u64() % 400) as i32 - 40;
                let u = *pick(
                    &mut r,
                    &[0u32, 5, 100, u32::MAX - 2, u32::MAX - 150, 0x8000_0000 - 20],
                );
                let scalars = (small(&mut r), small(&mut r), u, i64::from(small(&mut r)));
                let memory = [small(&mut r), small(&mut r)];
                let name = format!("k{k}");
                let want = launch(&device, &so_p, &name, &dims, scalars, &memory);
                let got = launch(&device, &bc_p, &name, &dims, scalars, &memory);
                assert!(
                    want == got,
                    "seed {seed:#x} kernel {name} (grid {:?}, block {:?}, n m u l = {scalars:?}, \
                     p = {memory:?}): the bitcode's work-group function differs from the shared \
                     object; source in {}",
                    dims.grid,
                    dims.block,
                    so.with_extension("c").display()
                );
            }
        }
    }
}

/// The post-optimisation IR of `bc` as the host JIT makes it.
fn optimised_ir(bc: &Path, tag: &str) -> String {
    let dir = scratch("item-bounds-ir");
    let ir = dir.join(format!("{tag}.ll"));
    host_jit(
        bc,
        "znver3",
        &dir.join(format!("{tag}.so")),
        &[("OFFLOAD_JIT_POST_OPT_IR_MODULE", ir.to_str().unwrap())],
    );
    std::fs::read_to_string(&ir).unwrap()
}

/// The body of function `name` in `ir`.
fn function<'a>(ir: &'a str, name: &str) -> &'a str {
    let start = ir
        .find(&format!("@{name}("))
        .unwrap_or_else(|| panic!("no {name} in the IR"));
    let end = ir[start..].find("\n}\n").unwrap() + start;
    &ir[start..end]
}

#[test]
fn common_guards_become_loop_bounds_without_masked_memory() {
    let shapes = [
        (
            "lt",
            "unsigned i = offload_global_id_x(); if (i < (unsigned)n) y[i] = a * x[i] + y[i];",
        ),
        (
            "signed",
            "int i = offload_global_id_x(); if (i >= n) return; y[i] = a * x[i] + y[i];",
        ),
        (
            "le",
            "unsigned i = offload_global_id_x(); if (i <= (unsigned)n - 1) y[i] += a * x[i];",
        ),
        (
            "lower",
            "unsigned i = offload_global_id_x(); if (i < 4 || i >= (unsigned)n) return; y[i] += a * x[i];",
        ),
        (
            "size_t",
            "size_t i = (size_t)offload_block_id(0) * offload_block_dim(0) + offload_thread_id(0); if (i < (size_t)n) y[i] += a * x[i];",
        ),
        (
            "loaded",
            "unsigned i = offload_global_id_x(); if (i >= (unsigned)*limit) return; y[i] += a * x[i];",
        ),
        (
            "2d",
            "unsigned c = offload_global_id_x(), r = offload_block_id(1) * offload_block_dim(1) + offload_thread_id(1); if (r >= (unsigned)n || c >= (unsigned)n) return; y[r * n + c] += a * x[r * n + c];",
        ),
    ];
    let mut src = String::from("#include <stddef.h>\n#include \"offload_kernel.h\"\n");
    for (name, body) in shapes {
        src.push_str(&format!(
            "OFFLOAD_KERNEL void k_{name}(int n, float a, const float *x, float *y, const int *limit) {{ (void)limit; {body} }}\n"
        ));
    }
    let (_, bc) = host_kernel_from_source("shapes", &src);
    let ir = optimised_ir(&bc, "shapes");
    for (name, _) in shapes {
        let wg = function(&ir, &format!("__offload_wg_k_{name}"));
        // (With the guard in the loop's body, the vectoriser makes masked loads and stores.)
        assert!(
            !wg.contains("llvm.masked."),
            "{name}: masked loads or stores are left:\n{wg}"
        );
        assert!(wg.contains("<8 x float>"), "{name}: not vectorised:\n{wg}");
    }
}

#[test]
fn a_load_after_a_guard_is_not_moved_before_it() {
    // With n = 0 no work item passes the first guard, so none reads p: a null p is fine.
    let src = "#include \"offload_kernel.h\"\n\
        OFFLOAD_KERNEL void k(int n, const int *p, int *out) {\n\
          unsigned i = offload_global_id_x();\n\
          if (i >= (unsigned)n) return;\n\
          if (i >= (unsigned)p[0]) return;\n\
          out[i] = 1;\n\
        }\n";
    let (so, bc) = host_kernel_from_source("late-load", src);
    let rt = host_runtime();
    let device = rt.device("host", 0).unwrap();
    for image in [so, bc] {
        let program = offload_tests::load(&device, &std::fs::read(&image).unwrap()).unwrap();
        let kernel = program.kernel("k").unwrap();
        let out = device.alloc_buffer(256 * 4).unwrap();
        let dims = LaunchDims {
            grid: [4, 1, 1],
            block: [64, 1, 1],
            shared_mem_bytes: 0,
        };
        let args = [
            KernelArg::I32(0),
            KernelArg::Ptr(offload::DevicePtr::NULL),
            KernelArg::Ptr(out.ptr()),
        ];
        // SAFETY: with n = 0 the kernel touches no memory.
        unsafe { kernel.launch(dims).args_raw(&args).unchecked().run() }
            .unwrap_or_else(|e| panic!("{}: {e}", image.display()));
    }
}
