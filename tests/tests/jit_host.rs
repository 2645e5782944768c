//! Host bitcode through the plugin's JIT engine: same results as the precompiled shared object,
//! routing by triple, the address-reuse scenario of seed 001, clear errors for bad input and
//! bad settings, and the `offload jit` command.

use offload::Error;
use offload_tests::*;

fn run_saxpy(image: &std::path::Path, tag: &str, n: usize) -> (Vec<f32>, serde_json::Value) {
    let dir = scratch(tag);
    let out = offload(
        &[
            "run",
            image.to_str().unwrap(),
            "--kernel",
            "saxpy",
            "--grid",
            &n.div_ceil(128).to_string(),
            "--block",
            "128",
            "--arg",
            &format!("i32:{n}"),
            "--arg",
            "f32:-0.75",
            "--arg",
            &format!("buf:f32:{n}:iota"),
            "--arg",
            &format!("buf:f32:{n}:fill=2.5"),
            "--dump",
            dir.to_str().unwrap(),
            "--json",
        ],
        &[],
    );
    assert!(
        out.status.success(),
        "{}: {}",
        image.display(),
        stderr(&out)
    );
    (
        read_f32s(&dir.join("arg3.bin")),
        serde_json::from_str(&stdout(&out)).unwrap(),
    )
}

#[test]
fn bitcode_and_ir_give_the_same_results_as_the_shared_object() {
    let n = 100_003;
    let (from_so, json_so) = run_saxpy(&host_kernel("saxpy"), "jit-so", n);
    let (from_bc, json_bc) = run_saxpy(&host_bitcode("saxpy"), "jit-bc", n);
    let (from_ll, _) = run_saxpy(&kernel_ir("saxpy", &[], "ll"), "jit-ll", n);
    for i in 0..n {
        let want = -0.75f32 * i as f32 + 2.5;
        assert_eq!(from_so[i].to_bits(), want.to_bits(), "so[{i}]");
        assert_eq!(from_bc[i].to_bits(), want.to_bits(), "bc[{i}]");
        assert_eq!(from_ll[i].to_bits(), want.to_bits(), "ll[{i}]");
    }
    assert_eq!(json_so["jit"]["compiles"], 0);
    assert_eq!(json_bc["jit"]["compiles"], 1);
    assert_eq!(json_bc["jit"]["memory_hits"], 0);
    assert!(json_bc["jit"]["compile_ms"].as_f64().unwrap() > 0.0);
    assert_eq!(json_bc["device"], "host:0");
}

#[test]
fn the_seed_001_scenario_a_freed_bitcode_address_never_returns_the_old_program() {
    let rt = host_runtime();
    let device = rt.device("host", 0).unwrap();
    let slot = rt.plugin("host").unwrap();
    let a = std::fs::read(host_bitcode("variant_a")).unwrap();
    let b = std::fs::read(host_bitcode("variant_b")).unwrap();
    let out = device.alloc_buffer(64 * 4).unwrap();
    let run = |image: &[u8]| run_which(&device, &out, image);
    let mut buffer = Vec::with_capacity(a.len().max(b.len()));
    buffer.extend_from_slice(&a);
    let address = buffer.as_ptr();
    assert!(run(&buffer).iter().all(|&v| v == 0xAAAA));
    // A is unloaded (the Program was dropped); B now sits at the same address.
    buffer.clear();
    buffer.extend_from_slice(&b);
    assert_eq!(buffer.as_ptr(), address);
    let got = run(&buffer);
    for (i, v) in got.iter().enumerate() {
        assert_eq!(*v, 0xBBBB + i as u32, "B's kernel must run, never A's");
    }
    let before = slot.jit_stats().unwrap();
    assert_eq!(before.compiles, 2);
    // A fresh buffer with A's contents hits the cache: no compile.
    let fresh = a.clone();
    assert!(run(&fresh).iter().all(|&v| v == 0xAAAA));
    let after = slot.jit_stats().unwrap();
    assert_eq!(after.compiles, 2, "no new compile");
    assert_eq!(after.memory_hits, before.memory_hits + 1);
}

#[test]
fn bitcode_is_routed_by_triple() {
    // Without the cuda plugin, which would claim the nvptx64 bitcode (tests/tests/cuda.rs).
    let rt = offload::Runtime::with_plugin_dirs(
        &[testdev_plugin_dir(), host_plugin_dir()],
        Some(&["testdev".to_string(), "host".to_string()]),
    );
    let host_bc = std::fs::read(host_bitcode("saxpy")).unwrap();
    assert_eq!(rt.route(&host_bc).unwrap().to_string(), "host:0");
    let ptx_bc = std::fs::read(kernel_ir(
        "saxpy",
        &["-target", "nvptx64-nvidia-cuda", "-march=sm_90"],
        "bc",
    ))
    .unwrap();
    let e = rt.route(&ptx_bc).unwrap_err();
    assert!(matches!(e, Error::Unsupported(_)), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("no loaded plugin compiles this LLVM bitcode/IR"),
        "{text}"
    );
    assert!(
        text.contains("host: bitcode is for 'nvptx64-nvidia-cuda'"),
        "{text}"
    );
    assert!(
        text.contains("testdev: image is LLVM bitcode/IR; the testdev plugin has no JIT engine"),
        "{text}"
    );
}

#[test]
fn bad_bitcode_gives_clear_errors_and_the_process_survives() {
    let rt = host_runtime();
    let device = rt.device("host", 0).unwrap();
    let good = std::fs::read(host_bitcode("saxpy")).unwrap();
    let amd = std::fs::read(kernel_ir(
        "saxpy",
        &["-target", "amdgcn-amd-amdhsa", "-mcpu=gfx90a", "-nogpulib"],
        "bc",
    ))
    .unwrap();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("truncated", good[..good.len() / 2].to_vec(), "malformed LLVM bitcode"),
        ("corrupted", { let mut g = good.clone(); for b in g.iter_mut().skip(40).step_by(7) { *b ^= 0x5a; } g }, "malformed LLVM bitcode"),
        ("another architecture", amd, "'amdgcn-amd-amdhsa'"),
        (
            "IR failing verification",
            b"target triple = \"x86_64-unknown-linux-gnu\"\ndefine void @k() {\nentry:\n  br label %x\nx:\n  %v = phi i32 [ 0, %y ]\n  ret void\ny:\n  ret void\n}\n".to_vec(),
            "",
        ),
    ];
    for (case, image, want) in cases {
        let e = offload_tests::load(&device, &image)
            .map(|_| ())
            .unwrap_err();
        assert!(
            e.to_string().contains(want),
            "{case}: '{e}' should contain '{want}'"
        );
        assert!(
            matches!(e, Error::InvalidImage(_) | Error::CompileFailure(_)),
            "{case}: {e:?}"
        );
    }
    // Still works.
    let p = offload_tests::load(&device, &good).unwrap();
    p.kernel("saxpy").unwrap();

    let dir = scratch("bad-bitcode-cli");
    let path = dir.join("broken.bc");
    std::fs::write(&path, &good[..100]).unwrap();
    let out = offload(&["run", path.to_str().unwrap(), "--kernel", "saxpy"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("malformed LLVM bitcode"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn bad_jit_settings_name_the_variable() {
    let bc = host_bitcode("saxpy");
    for (var, value, want) in [
        (
            "OFFLOAD_JIT_OPT_LEVEL",
            "5",
            "OFFLOAD_JIT_OPT_LEVEL='5' is not valid: expected an integer from 0 to 3",
        ),
        (
            "LIBOMPTARGET_JIT_SKIP_OPT",
            "perhaps",
            "LIBOMPTARGET_JIT_SKIP_OPT='perhaps'",
        ),
        (
            "OFFLOAD_JIT_REPLACEMENT_MODULE",
            "/does not/exist.bc",
            "OFFLOAD_JIT_REPLACEMENT_MODULE='/does not/exist.bc'",
        ),
    ] {
        let out = offload(
            &["run", bc.to_str().unwrap(), "--kernel", "saxpy"],
            &[(var, value)],
        );
        assert_eq!(out.status.code(), Some(1), "{var}");
        assert!(stderr(&out).contains(want), "{var}: {}", stderr(&out));
        // Native images do not need the JIT: the host plugin stays usable, and info reports
        // the JIT's configuration error.
        let info = offload(&["info", "--json"], &[(var, value)]);
        let json: serde_json::Value = serde_json::from_str(&stdout(&info)).unwrap();
        assert_eq!(plugin_json(&json, "host")["status"], "ok");
        assert!(
            json["jit"]["error"].as_str().unwrap().contains(var),
            "{json}"
        );
    }
    // Good values are honoured: -O0 through the alias still gives correct results.
    let dir = scratch("jit-o0");
    let out = offload(
        &[
            "run",
            bc.to_str().unwrap(),
            "--kernel",
            "saxpy",
            "--block",
            "8",
            "--arg",
            "i32:8",
            "--arg",
            "f32:3",
            "--arg",
            "buf:f32:8:iota",
            "--arg",
            "buf:f32:8:fill=1",
            "--dump",
            dir.to_str().unwrap(),
        ],
        &[
            ("LIBOMPTARGET_JIT_OPT_LEVEL", "0"),
            (
                "OFFLOAD_JIT_POST_OPT_IR_MODULE",
                dir.join("post opt.ll").to_str().unwrap(),
            ),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        read_f32s(&dir.join("arg3.bin")),
        (0..8).map(|i| 3.0 * i as f32 + 1.0).collect::<Vec<_>>()
    );
    assert!(
        std::fs::read_to_string(dir.join("post opt.ll"))
            .unwrap()
            .contains("define"),
        "IR dump written"
    );
}

#[test]
fn offload_jit_writes_what_the_plugin_would_load() {
    let dir = scratch("offload-jit-cmd");
    // NVPTX without ptxas: PTX text, as the plugin would hand it to the driver, and a note
    // saying why (with ptxas it is a cubin: tests/tests/cuda.rs).
    let ptx_bc = kernel_ir(
        "saxpy",
        &["-target", "nvptx64-nvidia-cuda", "-march=sm_90"],
        "bc",
    );
    let ptx = dir.join("saxpy.ptx");
    let jit_ptx = |extra: &[&str], envs: &[(&str, &str)]| {
        let mut args = vec![
            "jit",
            ptx_bc.to_str().unwrap(),
            "--target",
            "nvptx64-nvidia-cuda",
            "--cpu",
            "sm_80",
            "-O",
            "2",
            "-o",
            ptx.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let out = offload(&args, envs);
        assert!(out.status.success(), "{}", stderr(&out));
        let text = std::fs::read_to_string(&ptx).unwrap();
        assert!(
            text.contains(".target sm_80") && text.contains(".visible .entry saxpy("),
            "{text}"
        );
        stdout(&out)
    };
    if !std::path::Path::new("/usr/local/cuda/bin/ptxas").exists() {
        let said = jit_ptx(
            &[],
            &[
                ("PATH", "/usr/bin:/bin"),
                ("CUDA_HOME", "/nonexistent"),
                ("CUDA_PATH", "/nonexistent"),
            ],
        );
        assert!(said.contains("PTX text; no ptxas found"), "{said}");
    }
    let said = jit_ptx(&["--emit-ptx"], &[]);
    assert!(said.contains("PTX text"), "{said}");

    // AMDGPU: a linked code object whose kernel stays global.
    let amd_bc = kernel_ir(
        "saxpy",
        &["-target", "amdgcn-amd-amdhsa", "-mcpu=gfx90a", "-nogpulib"],
        "bc",
    );
    let hsaco = dir.join("saxpy.hsaco");
    let out = offload(
        &[
            "jit",
            amd_bc.to_str().unwrap(),
            "--target",
            "amdgcn-amd-amdhsa",
            "--cpu",
            "gfx90a",
            "-o",
            hsaco.to_str().unwrap(),
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let bytes = std::fs::read(&hsaco).unwrap();
    assert_eq!(u16::from_le_bytes([bytes[16], bytes[17]]), 3, "ET_DYN");
    assert_eq!(u16::from_le_bytes([bytes[18], bytes[19]]), 224, "EM_AMDGPU");
    use object::{Object, ObjectSymbol};
    let f = object::File::parse(&*bytes).unwrap();
    assert!(
        f.dynamic_symbols()
            .any(|s| s.name() == Ok("saxpy") && s.is_global())
    );

    // Host: a shared object that `offload run` loads and runs.
    let so = dir.join("saxpy jit.so");
    let out = offload(
        &[
            "jit",
            host_bitcode("saxpy").to_str().unwrap(),
            "--target",
            "x86_64-unknown-linux-gnu",
            "--cpu",
            "x86-64",
            "-o",
            so.to_str().unwrap(),
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let (y, _) = run_saxpy(&so, "jit-cmd-run", 1000);
    assert_eq!(y[999], -0.75 * 999.0 + 2.5);

    // Errors: bad CPU, wrong triple, not bitcode, bad -O.
    let out = offload(
        &[
            "jit",
            ptx_bc.to_str().unwrap(),
            "--target",
            "nvptx64-nvidia-cuda",
            "--cpu",
            "sm_1000",
            "-o",
            ptx.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("CPU 'sm_1000' is not a processor LLVM knows"),
        "{}",
        stderr(&out)
    );
    let out = offload(
        &[
            "jit",
            ptx_bc.to_str().unwrap(),
            "--target",
            "amdgcn-amd-amdhsa",
            "--cpu",
            "gfx90a",
            "-o",
            ptx.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("bitcode is for 'nvptx64-nvidia-cuda'"),
        "{}",
        stderr(&out)
    );
    let out = offload(
        &[
            "jit",
            so.to_str().unwrap(),
            "--target",
            "x86_64-unknown-linux-gnu",
            "--cpu",
            "x86-64",
            "-o",
            "/dev/null",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    let out = offload(
        &[
            "jit",
            ptx_bc.to_str().unwrap(),
            "--target",
            "nvptx64-nvidia-cuda",
            "--cpu",
            "sm_90",
            "-O",
            "4",
            "-o",
            "/dev/null",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn launches_of_jit_kernels_are_checked_against_the_kernel_signature() {
    let bc = host_bitcode("saxpy");
    let bc = bc.to_str().unwrap();
    // Three arguments for a four-argument kernel.
    let out = offload(
        &[
            "run",
            bc,
            "--kernel",
            "saxpy",
            "--arg",
            "i32:4",
            "--arg",
            "f32:2",
            "--arg",
            "buf:f32:4",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("kernel 'saxpy' takes 4 argument(s) (i32, float, ptr, ptr); the launch passes 3 (i32, f32, ptr)"), "{err}");
    // A double where the kernel takes a float.
    let out = offload(
        &[
            "run",
            bc,
            "--kernel",
            "saxpy",
            "--arg",
            "i32:4",
            "--arg",
            "f64:2",
            "--arg",
            "buf:f32:4",
            "--arg",
            "buf:f32:4",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("argument 1 is float in the kernel; the launch passes f64"),
        "{}",
        stderr(&out)
    );
    // The 16-argument kernel from bitcode, with the right types, runs.
    let args16 = host_bitcode("args16");
    let mut args = vec![
        "run",
        args16.to_str().unwrap(),
        "--kernel",
        "args16",
        "--block",
        "4",
    ];
    for s in [
        "i32:1",
        "i64:2",
        "f32:3",
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
        "buf:f64:4",
        "i32:4",
    ] {
        args.extend(["--arg", s]);
    }
    let out = offload(&args, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    // sum(k * k for k in 1..=14) = 1015, times (i + 1)
    assert!(
        stdout(&out).contains("f64[4] = [1015, 2030, 3045, 4060]"),
        "{}",
        stdout(&out)
    );
}

/// Issue 17: a module with no top-level entity (only comments, as three of LLVM's NVPTX
/// CodeGen tests are) is IR. `offload jit` compiles it for the target asked; `offload run`
/// cannot route it by itself and says why, and on a chosen device it is compiled and holds no
/// kernel. Text that is not IR stays refused.
#[test]
fn modules_with_only_comments_are_ir_without_a_triple() {
    let dir = scratch("empty-modules");
    let empty = dir.join("empty module.ll");
    std::fs::write(
        &empty,
        "; RUN: llc < %s -mtriple=nvptx64 -mcpu=sm_90 | FileCheck %s\r\n\r\n; CHECK: .target sm_90\r\n",
    )
    .unwrap();
    let e = empty.to_str().unwrap();
    for (target, cpu, extra) in [
        ("nvptx64-nvidia-cuda", "sm_90", Some("--emit-ptx")),
        ("x86_64-unknown-linux-gnu", "x86-64", None),
        ("amdgcn-amd-amdhsa", "gfx90a", None),
    ] {
        let out_path = dir.join(format!("out.{target}"));
        let mut args = vec![
            "jit",
            e,
            "--target",
            target,
            "--cpu",
            cpu,
            "-o",
            out_path.to_str().unwrap(),
        ];
        args.extend(extra);
        let out = offload(&args, &[]);
        assert!(out.status.success(), "{target}: {}", stderr(&out));
        let bytes = std::fs::read(&out_path).unwrap();
        if target.starts_with("nvptx") {
            let ptx = String::from_utf8_lossy(&bytes);
            assert!(
                ptx.contains(".target sm_90") && !ptx.contains(".entry"),
                "{ptx}"
            );
        } else {
            assert_eq!(&bytes[..4], b"\x7fELF", "{target}");
        }
    }
    // Routing: no triple, and the error says the module is empty.
    let out = offload(&["run", e, "--kernel", "k"], &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("module is empty")
            && err.contains("no target triple")
            && err.contains("--device"),
        "{err}"
    );
    // On a chosen device: compiled for it, and the kernel is not there.
    let out = offload(&["run", e, "--kernel", "k", "--device", "host:0"], &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("'k'") && !err.contains("panicked"), "{err}");
    // Not IR: prose, binary after a comment, blank text.
    for (name, bytes) in [
        ("prose", b"hello world\n".to_vec()),
        ("binary", b"; header\n\x00\x01\x02\xff".to_vec()),
        ("blank", b" \n\t\n".to_vec()),
    ] {
        let p = dir.join(name);
        std::fs::write(&p, &bytes).unwrap();
        let out = offload(
            &[
                "jit",
                p.to_str().unwrap(),
                "--target",
                "x86_64-unknown-linux-gnu",
                "--cpu",
                "x86-64",
                "-o",
                dir.join("x").to_str().unwrap(),
            ],
            &[],
        );
        assert!(
            stderr(&out).contains("neither LLVM bitcode nor textual IR"),
            "{name}: {}",
            stderr(&out)
        );
        let out = offload(&["run", p.to_str().unwrap(), "--kernel", "k"], &[]);
        assert!(
            stderr(&out).contains("unknown image format"),
            "{name}: {}",
            stderr(&out)
        );
    }
}
