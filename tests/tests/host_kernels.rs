//! Kernels compiled by clang-19 from `kernels/*.c` run on the host backend, through the
//! `offload run` command and through the runtime API, and every output element is compared
//! with a reference computed independently here.

use offload::{KernelArg, LaunchDims};
use offload_tests::*;

fn dump_dir(tag: &str) -> std::path::PathBuf {
    scratch(tag)
}

#[test]
fn saxpy_one_million_and_three_through_offload_run() {
    let n: usize = 1_000_003;
    let so = host_kernel("saxpy");
    let dir = dump_dir("saxpy");
    // x = iota, y = fill 0.25, a = 1.5  =>  y[i] = 1.5 * i + 0.25
    let out = offload(
        &[
            "run",
            so.to_str().unwrap(),
            "--kernel",
            "saxpy",
            "--grid",
            &n.div_ceil(256).to_string(),
            "--block",
            "256",
            "--arg",
            &format!("i32:{n}"),
            "--arg",
            "f32:1.5",
            "--arg",
            &format!("buf:f32:{n}:iota"),
            "--arg",
            &format!("buf:f32:{n}:fill=0.25"),
            "--dump",
            dir.to_str().unwrap(),
            "--json",
        ],
        &[],
    );
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("one JSON object");
    assert_eq!(json["device"], "host:0");
    assert_eq!(json["kernel"], "saxpy");
    for k in ["load", "copy_in", "launch", "copy_out", "total"] {
        assert!(json["timings_ms"][k].as_f64().unwrap() >= 0.0, "timing {k}");
    }
    assert_eq!(json["buffers"][1]["arg"], 3);
    assert_eq!(json["buffers"][1]["head"][2], 3.25);

    let y = read_f32s(&dir.join("arg3.bin"));
    let x = read_f32s(&dir.join("arg2.bin"));
    assert_eq!(y.len(), n);
    for i in 0..n {
        let want = 1.5f32 * (i as f32) + 0.25f32;
        assert_eq!(
            y[i].to_bits(),
            want.to_bits(),
            "y[{i}] = {}, want {want}",
            y[i]
        );
        assert_eq!(x[i], i as f32, "x must be unchanged");
    }
    // Scalars are dumped too.
    assert_eq!(
        std::fs::read(dir.join("arg0.bin")).unwrap(),
        (n as i32).to_le_bytes()
    );
}

#[test]
fn stencil_with_two_dimensional_grid_and_block() {
    let (w, h) = (301usize, 203usize);
    let input: Vec<f32> = (0..w * h)
        .map(|i| ((i * 37) % 101) as f32 * 0.125)
        .collect();
    let dir = dump_dir("stencil");
    let in_file = dir.join("in.bin");
    std::fs::write(&in_file, f32_bytes(&input)).unwrap();
    let so = host_kernel("stencil2d");
    let (bx, by) = (16usize, 8usize);
    let out = offload(
        &[
            "run",
            so.to_str().unwrap(),
            "--kernel",
            "stencil2d",
            "--grid",
            &format!("{},{}", w.div_ceil(bx), h.div_ceil(by)),
            "--block",
            &format!("{bx},{by}"),
            "--arg",
            &format!("i32:{w}"),
            "--arg",
            &format!("i32:{h}"),
            "--arg",
            &format!("buf:f32:{}:file={}", w * h, in_file.display()),
            "--arg",
            &format!("buf:f32:{}", w * h),
            "--dump",
            dir.to_str().unwrap(),
        ],
        &[],
    );
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    assert!(
        stdout(&out).contains("grid 19x26x1, block 16x8x1"),
        "{}",
        stdout(&out)
    );
    let got = read_f32s(&dir.join("arg3.bin"));
    for y in 0..h {
        for x in 0..w {
            let i = y * w + x;
            let want = if x == 0 || y == 0 || x == w - 1 || y == h - 1 {
                input[i]
            } else {
                0.2f32
                    * ((((input[i] + input[i - 1]) + input[i + 1]) + input[i - w]) + input[i + w])
            };
            assert_eq!(
                got[i].to_bits(),
                want.to_bits(),
                "({x},{y}): {} vs {want}",
                got[i]
            );
        }
    }
}

#[test]
fn sixteen_mixed_arguments_arrive_intact() {
    let n = 1000usize;
    let so = host_kernel("args16");
    let dir = dump_dir("args16");
    let specs = [
        "i32:-7",
        "i64:-1099511627776",
        "f32:1.25",
        "f64:-2.5e-3",
        "i32:2147483647",
        "f32:-0.5",
        "f64:3.75",
        "i64:9000000000",
        "f32:1e-3",
        "f64:-1e10",
        "i32:-2147483648",
        "f64:0.1",
        "f32:65504",
        "i64:-3",
    ];
    let mut args = vec![
        "run",
        so.to_str().unwrap(),
        "--kernel",
        "args16",
        "--grid",
        "4",
        "--block",
        "256",
    ];
    for s in &specs {
        args.extend(["--arg", s]);
    }
    let out_spec = format!("buf:f64:{n}:fill=-1");
    let n_spec = format!("i32:{n}");
    args.extend([
        "--arg",
        &out_spec,
        "--arg",
        &n_spec,
        "--dump",
        dir.to_str().unwrap(),
    ]);
    let out = offload(&args, &[]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));

    let (a0, a1, a2, a3, a4, a5, a6) = (
        -7i32,
        -1099511627776i64,
        1.25f32,
        -2.5e-3f64,
        2147483647i32,
        -0.5f32,
        3.75f64,
    );
    let (a7, a8, a9, a10, a11, a12, a13) = (
        9000000000i64,
        1e-3f32,
        -1e10f64,
        -2147483648i32,
        0.1f64,
        65504f32,
        -3i64,
    );
    let s = f64::from(a0)
        + a1 as f64 * 2.0
        + f64::from(a2) * 3.0
        + a3 * 4.0
        + f64::from(a4) * 5.0
        + f64::from(a5) * 6.0
        + a6 * 7.0
        + a7 as f64 * 8.0
        + f64::from(a8) * 9.0
        + a9 * 10.0
        + f64::from(a10) * 11.0
        + a11 * 12.0
        + f64::from(a12) * 13.0
        + a13 as f64 * 14.0;
    let bytes = std::fs::read(dir.join("arg14.bin")).unwrap();
    let got: Vec<f64> = bytes
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(got.len(), n);
    for (i, g) in got.iter().enumerate() {
        let want = s * (i as f64 + 1.0);
        assert_eq!(g.to_bits(), want.to_bits(), "out[{i}] = {g}, want {want}");
    }
}

#[test]
fn atomics_from_many_blocks_at_once() {
    let (n, bins) = (2_000_000usize, 97usize);
    let so = host_kernel("atomics");
    let dir = dump_dir("atomics");
    let out = offload(
        &[
            "run",
            so.to_str().unwrap(),
            "--kernel",
            "histogram",
            "--grid",
            &n.div_ceil(128).to_string(),
            "--block",
            "128",
            "--arg",
            &format!("i32:{n}"),
            "--arg",
            &format!("i32:{bins}"),
            "--arg",
            &format!("buf:u32:{bins}"),
            "--arg",
            "buf:u64:1:fill=5",
            "--dump",
            dir.to_str().unwrap(),
        ],
        &[("OFFLOAD_HOST_THREADS", "4")],
    );
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let mut want = vec![0u32; bins];
    for i in 0..n {
        want[(i * 7) % bins] += 1;
    }
    let got: Vec<u32> = std::fs::read(dir.join("arg2.bin"))
        .unwrap()
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(got, want);
    let count = u64::from_le_bytes(
        std::fs::read(dir.join("arg3.bin"))
            .unwrap()
            .try_into()
            .unwrap(),
    );
    assert_eq!(count, 5 + n as u64);
}

#[test]
fn every_work_item_sees_its_own_ids_in_three_dimensions() {
    let rt = host_runtime();
    let image = std::fs::read(host_kernel("ids")).unwrap();
    let device = rt.route(&image).unwrap();
    let program = offload_tests::load(&device, &image).unwrap();
    let kernel = program.kernel("ids").unwrap();
    let dims = LaunchDims {
        grid: [3, 2, 2],
        block: [4, 3, 2],
        shared_mem_bytes: 0,
    };
    let items = (dims.blocks() * dims.threads_per_block()) as usize;
    let buf = device.alloc_buffer((items * 12 * 4) as u64).unwrap();
    // SAFETY: the buffers are as long as the kernel touches for these arguments.
    unsafe {
        kernel
            .launch(dims)
            .args_raw(&[KernelArg::Ptr(buf.ptr())])
            .unchecked()
            .run()
    }
    .unwrap();
    let mut raw = vec![0u8; items * 48];
    buf.read(&mut raw).unwrap();
    let got: Vec<u32> = raw
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let mut seen = 0;
    for bz in 0..2u32 {
        for by in 0..2u32 {
            for bx in 0..3u32 {
                for tz in 0..2u32 {
                    for ty in 0..3u32 {
                        for tx in 0..4u32 {
                            let block = (bz * 2 + by) * 3 + bx;
                            let thread = (tz * 3 + ty) * 4 + tx;
                            let at = 12 * (block * 24 + thread) as usize;
                            assert_eq!(
                                &got[at..at + 12],
                                &[tx, ty, tz, bx, by, bz, 4, 3, 2, 3, 2, 2],
                                "work item block ({bx},{by},{bz}) thread ({tx},{ty},{tz})"
                            );
                            seen += 1;
                        }
                    }
                }
            }
        }
    }
    assert_eq!(seen, items);
}

#[test]
fn large_allocations_are_zeroed_mappings_on_huge_pages() {
    // The system's transparent huge page setting decides what the hint gives.
    let thp =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    let huge_pages_possible = !thp.contains("[never]") && !thp.is_empty();
    let rt = host_runtime();
    let device = rt.device("host", 0).unwrap();
    for size in [4096u64, (2 << 20) - 256, 2 << 20, (8 << 20) + 12, 64 << 20] {
        let buf = device.alloc_buffer(size).unwrap();
        let addr = buf.ptr().0;
        assert_eq!(addr % 256, 0, "{size} bytes at {addr:#x}");
        let mut back = vec![1u8; size as usize];
        buf.read(&mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0), "{size} bytes: not zeroed");
        let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        buf.write(&data).unwrap();
        buf.read(&mut back).unwrap();
        assert!(back == data, "{size} bytes: round trip");
        if size < 2 << 20 {
            continue;
        }
        assert_eq!(
            addr % (2 << 20),
            0,
            "{size} bytes at {addr:#x}: not on a huge page"
        );
        // A mapping of its own, with the hint (whether the kernel then grants huge pages
        // depends on its free memory).
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let start = format!("{addr:x}-");
        let flags = smaps
            .lines()
            .skip_while(|l| !l.starts_with(&start))
            .find(|l| l.starts_with("VmFlags:"))
            .unwrap_or_else(|| panic!("{size} bytes at {addr:#x}: no mapping starts there"));
        if huge_pages_possible {
            assert!(
                flags.contains(" hg"),
                "{size} bytes: no huge page hint: {flags}"
            );
        }
    }
}
