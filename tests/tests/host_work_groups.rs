//! The host's execution of blocks: work-group functions for bitcode (the JIT's), direct calls
//! for native images, fibers for kernels with barriers, block-shared memory (static and
//! dynamic). Every kernel gives the same results from a shared object and from bitcode, and the
//! results the GPU semantics require; the barrier kernels also compile for nvptx64 and amdgcn.

use offload_tests::*;
use std::path::{Path, PathBuf};

/// Runs `image` with `args` and returns the final contents of every argument (by index).
fn run(
    image: &Path,
    kernel: &str,
    grid: &str,
    block: &str,
    shared: u32,
    args: &[String],
    tag: &str,
) -> Vec<Vec<u8>> {
    let dump = scratch("host-wg").join(tag);
    let mut a: Vec<String> = vec![
        "run".into(),
        image.display().to_string(),
        "--kernel".into(),
        kernel.into(),
        "--device".into(),
        "host:0".into(),
        "--grid".into(),
        grid.into(),
        "--block".into(),
        block.into(),
        "--shared-mem".into(),
        shared.to_string(),
        "--dump".into(),
        dump.display().to_string(),
    ];
    for s in args {
        a.push("--arg".into());
        a.push(s.clone());
    }
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let out = offload(&a, &[]);
    assert!(out.status.success(), "{tag}: {}", stderr(&out));
    (0..args.len())
        .map(|i| std::fs::read(dump.join(format!("arg{i}.bin"))).unwrap())
        .collect()
}

/// The value of the 4-byte data symbol `name` of the ELF shared object `elf`.
fn u32_symbol(elf: &[u8], name: &str) -> Option<u32> {
    use object::{Object, ObjectSection, ObjectSymbol};
    let file = object::File::parse(elf).ok()?;
    let sym = file
        .symbols()
        .chain(file.dynamic_symbols())
        .find(|s| s.name() == Ok(name))?;
    let section = file.section_by_index(sym.section_index()?).ok()?;
    let data = section.data().ok()?;
    let at = (sym.address() - section.address()) as usize;
    Some(u32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?))
}

fn u32s(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn i32s(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// The shared object and the bitcode of `kernels/<name>.c`.
fn both(name: &str) -> [(PathBuf, &'static str); 2] {
    [(host_kernel(name), "so"), (host_bitcode(name), "bc")]
}

#[test]
fn a_block_reduction_with_barriers_and_static_shared_memory() {
    let n = 100_000usize;
    for (image, kind) in both("reduce") {
        for block in [1u32, 64, 256, 1024] {
            let blocks = n.div_ceil(2 * block as usize);
            let out = run(
                &image,
                "block_sum",
                &blocks.to_string(),
                &block.to_string(),
                0,
                &[
                    format!("buf:u32:{n}:iota"),
                    format!("buf:u32:{blocks}"),
                    format!("i32:{n}"),
                ],
                &format!("reduce-{kind}-{block}"),
            );
            let got = u32s(&out[1]);
            for (b, sum) in got.iter().enumerate() {
                let lo = b * 2 * block as usize;
                let hi = (lo + 2 * block as usize).min(n);
                let want: u64 = (lo as u64..hi as u64).sum();
                assert_eq!(
                    u64::from(*sum),
                    want & 0xffff_ffff,
                    "{kind}, block {block}, sum of block {b}"
                );
            }
        }
    }
}

#[test]
fn a_prefix_scan_in_dynamic_shared_memory() {
    let n = 5000usize;
    for (image, kind) in both("scan") {
        for block in [32u32, 256, 512] {
            let blocks = n.div_ceil(block as usize);
            let out = run(
                &image,
                "block_scan",
                &blocks.to_string(),
                &block.to_string(),
                2 * block * 4,
                &[
                    format!("buf:i32:{n}:iota"),
                    format!("buf:i32:{n}"),
                    format!("i32:{n}"),
                ],
                &format!("scan-{kind}-{block}"),
            );
            let got = i32s(&out[1]);
            let want: Vec<i32> = (0..n)
                .map(|i| (i - i % block as usize..=i).map(|k| k as i32).sum())
                .collect();
            assert_eq!(got, want, "{kind}, block {block}");
        }
    }
}

#[test]
fn a_tiled_matrix_product_in_two_dimensions() {
    let n = 50usize; // not a multiple of the tile: edges exercised
    let tiles = n.div_ceil(16);
    let a: Vec<f32> = (0..n * n).map(|i| (i % 7) as f32 - 3.0).collect();
    let b: Vec<f32> = (0..n * n).map(|i| (i % 5) as f32 * 0.5).collect();
    let dir = scratch("host-wg-matmul");
    let (fa, fb) = (dir.join("a.bin"), dir.join("b.bin"));
    std::fs::write(&fa, f32_bytes(&a)).unwrap();
    std::fs::write(&fb, f32_bytes(&b)).unwrap();
    let mut want = vec![0f32; n * n];
    for r in 0..n {
        for c in 0..n {
            let mut acc = 0f32;
            for k in 0..n {
                acc += a[r * n + k] * b[k * n + c];
            }
            want[r * n + c] = acc;
        }
    }
    for (image, kind) in both("matmul_tiled") {
        let out = run(
            &image,
            "matmul_tiled",
            &format!("{tiles},{tiles}"),
            "16,16",
            0,
            &[
                format!("i32:{n}"),
                format!("buf:f32:{}:file={}", n * n, fa.display()),
                format!("buf:f32:{}:file={}", n * n, fb.display()),
                format!("buf:f32:{}", n * n),
            ],
            &format!("matmul-{kind}"),
        );
        let got = f32s(&out[3]);
        for i in 0..n * n {
            assert_eq!(
                got[i].to_bits(),
                want[i].to_bits(),
                "{kind}: element {i}: {} vs {}",
                got[i],
                want[i]
            );
        }
    }
}

#[test]
fn bitcode_kernels_become_work_group_functions_with_the_shared_objects_results() {
    // The JIT's image exports a work-group function for each kernel, with barriers or without.
    let dir = scratch("host-wg-jit");
    for (kernel, symbol, wg) in [
        ("saxpy", "saxpy", true),
        ("stencil2d", "stencil2d", true),
        ("args16", "args16", true),
        ("atomics", "histogram", true),
        ("ids", "ids", true),
        ("reduce", "block_sum", true),
        ("scan", "block_scan", true),
    ] {
        let out = dir.join(format!("{kernel}.so"));
        host_jit(&host_bitcode(kernel), "x86-64", &out, &[]);
        let bytes = std::fs::read(&out).unwrap();
        let wg_name = format!("__offload_wg_{symbol}");
        let has = bytes
            .windows(wg_name.len() + 1)
            .any(|w| w[..wg_name.len()] == *wg_name.as_bytes() && w[wg_name.len()] == 0);
        // The calling convention's version the JIT wrote is the one the plugin calls.
        let (abi_name, abi) = offload_host::WORK_GROUP_ABI;
        assert_eq!(
            u32_symbol(&bytes, abi_name),
            Some(abi),
            "{kernel}: the JIT's {abi_name} is not the plugin's work-group ABI {abi}"
        );
        assert_eq!(has, wg, "{kernel}: work-group function {wg_name}");
    }
    // Same results, bit for bit, from the shared object (direct calls) and the bitcode
    // (work-group functions), including 3-D blocks, partial blocks and atomics.
    let cases: [(&str, &str, &str, &str, Vec<String>); 5] = [
        (
            "saxpy",
            "saxpy",
            "40",
            "250",
            vec![
                "i32:9999".into(),
                "f32:1.5".into(),
                "buf:f32:10000:iota".into(),
                "buf:f32:10000:fill=2".into(),
            ],
        ),
        (
            "stencil2d",
            "stencil2d",
            "8,8",
            "16,16",
            vec![
                "i32:120".into(),
                "i32:100".into(),
                "buf:f32:12000:iota".into(),
                "buf:f32:12000".into(),
            ],
        ),
        (
            "args16",
            "args16",
            "3",
            "100",
            [
                "i32:1",
                "i64:-2",
                "f32:3.5",
                "f64:4",
                "i32:5",
                "f32:6",
                "f64:7",
                "i64:8",
                "f32:9",
                "f64:10",
                "i32:11",
                "f64:12",
                "f32:13",
                "i64:14",
                "buf:f64:300",
                "i32:290",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        ),
        (
            "atomics",
            "histogram",
            "100",
            "128",
            vec![
                "i32:12345".into(),
                "i32:37".into(),
                "buf:u32:37".into(),
                "buf:u64:1".into(),
            ],
        ),
        ("ids", "ids", "3,2,2", "4,3,5", vec!["buf:u32:8640".into()]),
    ];
    for (kernel, symbol, grid, block, args) in cases {
        let so = run(
            &host_kernel(kernel),
            symbol,
            grid,
            block,
            0,
            &args,
            &format!("eq-{kernel}-so"),
        );
        let bc = run(
            &host_bitcode(kernel),
            symbol,
            grid,
            block,
            0,
            &args,
            &format!("eq-{kernel}-bc"),
        );
        assert_eq!(so, bc, "{kernel}: shared object and bitcode differ");
    }
}

#[test]
fn divergent_barriers_faults_in_fibers_and_oversized_blocks_are_errors() {
    let (so, bc) = host_kernel_from_source(
        "divergent",
        "#include \"offload_kernel.h\"\nOFFLOAD_KERNEL void k(int *out) {\n  if (offload_thread_id(0) == 3) offload_barrier();\n  out[offload_thread_id(0)] = 1;\n}\n",
    );
    for image in [&so, &bc] {
        let out = offload(
            &[
                "run",
                image.to_str().unwrap(),
                "--kernel",
                "k",
                "--block",
                "8",
                "--arg",
                "buf:i32:8",
            ],
            &[],
        );
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains("some work items reached an offload_barrier() that others did not"),
            "{err}"
        );
    }
    let (so, bc) = host_kernel_from_source(
        "fiberfault",
        "#include \"offload_kernel.h\"\nOFFLOAD_KERNEL void k(int *out) {\n  out[offload_thread_id(0)] = 1;\n  offload_barrier();\n  if (offload_thread_id(0) == 5) *(volatile int *)(unsigned long)(8 * offload_thread_id(0)) = 1;\n}\n",
    );
    for image in [&so, &bc] {
        let out = offload(
            &[
                "run",
                image.to_str().unwrap(),
                "--kernel",
                "k",
                "--grid",
                "3",
                "--block",
                "8",
                "--arg",
                "buf:i32:8",
            ],
            &[],
        );
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{err}");
        // Fibers know the work item; a work-group function knows its range of blocks.
        let at = if image == &so {
            "work item (5, 0, 0)"
        } else {
            "in one of the blocks"
        };
        assert!(
            err.contains("faulted: SIGSEGV") && err.contains(at),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    let out = offload(
        &[
            "run",
            host_kernel("saxpy").to_str().unwrap(),
            "--kernel",
            "saxpy",
            "--block",
            "2048",
            "--arg",
            "i32:1",
            "--arg",
            "f32:1",
            "--arg",
            "buf:f32:1",
            "--arg",
            "buf:f32:1",
        ],
        &[],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("2048") && err.contains("1024"), "{err}");
    // The JIT's work-group functions are not kernels to launch.
    let out = offload(
        &[
            "run",
            host_bitcode("saxpy").to_str().unwrap(),
            "--kernel",
            "__offload_wg_saxpy",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("reserved"), "{}", stderr(&out));
}

#[test]
fn blocks_may_differ_in_whether_they_reach_barriers() {
    // A condition the same for every work item of a block may skip barriers in some blocks
    // (legal on a GPU): odd blocks reverse their items through shared memory, even blocks
    // copy. Block 0 reaching no barrier must not decide for the others.
    let (so, bc) = host_kernel_from_source(
        "someblocks",
        "#include \"offload_kernel.h\"\nOFFLOAD_KERNEL void k(const int *in, int *out) {\n  OFFLOAD_SHARED int s[256];\n  unsigned t = offload_thread_id(0), B = offload_block_dim(0), b = offload_block_id(0);\n  int v = in[b * B + t];\n  if (b % 2 == 1) {\n    s[t] = v;\n    offload_barrier();\n    v = s[B - 1 - t];\n  }\n  out[b * B + t] = v;\n}\n",
    );
    for (image, tag) in [(&so, "so"), (&bc, "bc")] {
        let out = run(
            image,
            "k",
            "6",
            "64",
            0,
            &["buf:i32:384:iota".into(), "buf:i32:384".into()],
            &format!("someblocks-{tag}"),
        );
        let got = i32s(&out[1]);
        let want: Vec<i32> = (0..384)
            .map(|i| {
                let (b, t) = (i / 64, i % 64);
                if b % 2 == 1 { b * 64 + 63 - t } else { i }
            })
            .collect();
        assert_eq!(got, want, "{tag}");
    }
}

#[test]
fn barrier_and_shared_memory_kernels_compile_for_nvptx64_and_amdgcn() {
    for kernel in ["reduce", "scan", "matmul_tiled"] {
        let ptx = nvptx_jit(
            &nvptx_bitcode(kernel, "sm_90"),
            "sm_90",
            &["--emit-ptx"],
            &format!("wg-{kernel}"),
        );
        let text = String::from_utf8(ptx).unwrap();
        assert!(text.contains("bar.sync"), "{kernel}: {text}");
        assert!(text.contains(".shared"), "{kernel}");
        let co = amdgcn_jit(
            &amdgcn_bitcode(kernel, "gfx90a"),
            "gfx90a",
            &[],
            &format!("wg-{kernel}"),
        );
        let info = match offload_core::classify(&co).unwrap() {
            offload_core::ImageKind::Elf(i) => i,
            other => panic!("{other:?}"),
        };
        assert_eq!(info.machine, offload_core::image::machine::AMDGPU);
        // The code has its barrier (s_barrier, SOPP opcode 0xbf8a0000) and, for the static tiles,
        // LDS in the metadata.
        assert!(
            co.windows(4).any(|w| w == [0x00, 0x00, 0x8a, 0xbf]),
            "{kernel}: no s_barrier"
        );
        let meta = offload_amdgpu::metadata::read(&co).unwrap();
        let lds = meta.kernels[0].group_segment_fixed_size;
        if kernel == "scan" {
            assert!(
                meta.kernels[0]
                    .args
                    .iter()
                    .any(|a| a.value_kind == "hidden_dynamic_lds_size")
                    || lds == 0,
                "{kernel}: {lds}"
            );
        } else {
            assert!(lds > 0, "{kernel}: static LDS {lds}");
        }
    }
}
