//! The engine through the JIT client and the worker process, as every runtime process uses it:
//! bad inputs give clear errors and the caller survives, the cache compiles once per key and in
//! parallel across keys, the environment variables are honoured and validated, and the engine
//! defects found on LLVM's own test files stay fixed (classification of IR, data layouts,
//! static constructors, target features, modules without a triple, linker use).

use offload_core::Error;
use offload_core::jit::{CompileRequest, JitService, JitTarget, OutputPath, PostProcess, Served};
use offload_jit_client::{Isolation, JitClient, JitConfig};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const PTX: &str = "nvptx64-nvidia-cuda";
const HOST: &str = "x86_64-unknown-linux-gnu";
const WORKER: &str = env!("CARGO_BIN_EXE_offload-jit-worker");

fn config() -> JitConfig {
    JitConfig {
        worker: Some(WORKER.into()),
        ..JitConfig::default()
    }
}

fn client_with(config: JitConfig) -> JitClient {
    JitClient::new(Ok(config), Vec::new())
}

fn client() -> JitClient {
    client_with(config())
}

fn target(triple: &str, cpu: &str, features: &str) -> JitTarget {
    JitTarget {
        triple: triple.into(),
        cpu: cpu.into(),
        features: features.into(),
    }
}

fn sm90() -> JitTarget {
    target(PTX, "sm_90", "")
}

fn ptx_request(image: &[u8]) -> CompileRequest<'_> {
    CompileRequest {
        image,
        target: sm90(),
        post: PostProcess::Unchanged,
    }
}

fn kernel_ir(name: &str, body_constant: u32) -> String {
    format!(
        r#"source_filename = "{name}.ll"
target triple = "nvptx64-nvidia-cuda"
define ptx_kernel void @{name}(ptr %out) {{
  store i32 {body_constant}, ptr %out
  ret void
}}
"#
    )
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("offload-jit-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn clang_bitcode(kernel: &str, args: &[&str], out: &Path) -> Vec<u8> {
    let status = std::process::Command::new("clang-19")
        .args(["-O2", "-emit-llvm", "-c", "-I"])
        .arg(repo().join("include"))
        .args(args)
        .arg(repo().join(format!("kernels/{kernel}.c")))
        .arg("-o")
        .arg(out)
        .status()
        .expect("clang-19 (run scripts/setup.sh)");
    assert!(status.success());
    std::fs::read(out).unwrap()
}

/// Runs this test binary's `test` in a child process with `vars` set, returning its stdout:
/// environment changes never leak into other tests.
fn in_child(test: &str, vars: &[(&str, &str)]) -> String {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"]);
    for v in [
        "OFFLOAD_JIT_OPT_LEVEL",
        "LIBOMPTARGET_JIT_OPT_LEVEL",
        "OFFLOAD_JIT_SKIP_OPT",
        "LIBOMPTARGET_JIT_SKIP_OPT",
        "OFFLOAD_JIT_CACHE_MB",
        "OFFLOAD_JIT_TIMEOUT",
        "OFFLOAD_JIT_MEMORY_LIMIT",
        "OFFLOAD_JIT_CPU_LIMIT",
        "OFFLOAD_JIT_FILE_SIZE_LIMIT",
        "OFFLOAD_JIT_OPEN_FILES_LIMIT",
        "OFFLOAD_JIT_ISOLATION",
        "OFFLOAD_JIT_WORKER",
    ] {
        cmd.env_remove(v);
    }
    cmd.env("OFFLOAD_JIT_ENGINE_TEST_CHILD", "1");
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn is_child() -> bool {
    std::env::var_os("OFFLOAD_JIT_ENGINE_TEST_CHILD").is_some()
}

#[test]
fn textual_ir_and_bitcode_are_both_accepted() {
    let c = client();
    let out = c
        .compile(&ptx_request(kernel_ir("k", 42).as_bytes()))
        .unwrap();
    let ptx = String::from_utf8(out.image.bytes.clone()).unwrap();
    assert!(ptx.contains(".visible .entry k("), "{ptx}");
    assert!(ptx.contains("42"), "{ptx}");
    assert_eq!(out.served, Served::Compiled);
    let bc = clang_bitcode(
        "saxpy",
        &["-target", PTX, "-march=sm_90"],
        &scratch("bc").join("saxpy.bc"),
    );
    let out = c.compile(&ptx_request(&bc)).unwrap();
    assert!(String::from_utf8_lossy(&out.image.bytes).contains(".visible .entry saxpy("));
    assert_eq!(c.worker_stats().starts, 1, "one worker for both compiles");
}

#[test]
fn bad_inputs_give_clear_errors_and_the_process_survives() {
    let c = client();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("truncated bitcode", b"BC\xc0\xde\x35\x14\x00\x00\x05\x00".to_vec(), "malformed LLVM bitcode"),
        ("garbage after magic", [b"BC\xc0\xde".to_vec(), vec![0xff; 200]].concat(), "malformed LLVM bitcode"),
        ("IR syntax error", b"target triple = \"nvptx64-nvidia-cuda\"\ndefine void @f( {".to_vec(), "invalid LLVM IR"),
        (
            "IR failing verification",
            b"target triple = \"nvptx64-nvidia-cuda\"\ndefine i32 @f() {\n  ret void\n}\n".to_vec(),
            "invalid LLVM IR",
        ),
        (
            "missing terminator",
            b"target triple = \"nvptx64-nvidia-cuda\"\ndefine void @f(i32 %x) {\nentry:\n  %y = add i32 %x, 1\n}\n".to_vec(),
            "invalid LLVM IR",
        ),
        (
            "IR for another architecture",
            b"target triple = \"amdgcn-amd-amdhsa\"\ndefine amdgpu_kernel void @f() {\n  ret void\n}\n".to_vec(),
            "module triple 'amdgcn-amd-amdhsa' does not match",
        ),
        ("not IR at all", b"\x7fELF this is not bitcode".to_vec(), "neither LLVM bitcode"),
    ];
    for (case, bytes, want) in cases {
        let err = c.compile(&ptx_request(&bytes)).unwrap_err();
        assert!(
            err.to_string().contains(want),
            "{case}: '{err}' should contain '{want}'"
        );
        assert!(
            matches!(err, Error::InvalidImage(_) | Error::CompileFailure(_)),
            "{case}: {err:?}"
        );
    }
    // A CPU the target does not know is refused before code generation, listing the known ones.
    let mut req = ptx_request(b"");
    let ir = kernel_ir("k", 1);
    req.image = ir.as_bytes();
    req.target.cpu = "sm_9000".into();
    let err = c.compile(&req).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert!(
        err.to_string().contains("CPU 'sm_9000'") && err.to_string().contains("sm_90"),
        "{err}"
    );
    // A triple LLVM has no target for.
    req.target = target("sparc-sun-solaris", "v9", "");
    let err = c.compile(&req).unwrap_err();
    assert!(err.to_string().contains("no LLVM target"), "{err}");
    // Nothing above killed the worker, and it still compiles.
    c.compile(&ptx_request(kernel_ir("k", 7).as_bytes()))
        .unwrap();
    assert_eq!(c.worker_stats().starts, 1);
    assert_eq!(c.worker_stats().deaths, 0);
    // Every failure above that reached the cache (the non-IR bytes are refused before it).
    assert_eq!(c.stats().failures, 8);
}

#[test]
fn sixteen_threads_asking_for_the_same_key_compile_once() {
    let c = Arc::new(client());
    let ir = kernel_ir("shared", 5);
    std::thread::scope(|s| {
        for _ in 0..16 {
            let (c, ir) = (c.clone(), ir.clone());
            s.spawn(move || c.compile(&ptx_request(ir.as_bytes())).unwrap());
        }
    });
    let st = c.stats();
    assert_eq!(st.compiles, 1, "{st:?}");
    assert_eq!(st.memory_hits + st.shared_waits, 15, "{st:?}");
}

#[test]
fn different_keys_compile_at_the_same_time_inside_the_worker() {
    // The worker holds each compile until two have started (OFFLOAD_JIT_WORKER_RENDEZVOUS=2)
    // and fails it if that never happens within 20 s. If the worker or the client serialised
    // compiles, the first could never meet the second: the test observes the overlap as
    // success instead of timing it.
    if is_child() {
        let c = Arc::new(client());
        std::thread::scope(|s| {
            for (name, v) in [("a", 1), ("b", 2)] {
                let c = c.clone();
                s.spawn(move || {
                    c.compile(&ptx_request(kernel_ir(name, v).as_bytes()))
                        .unwrap();
                });
            }
        });
        println!(
            "PEAK {} COMPILES {}",
            c.stats().peak_in_flight,
            c.stats().compiles
        );
        return;
    }
    let out = in_child(
        "different_keys_compile_at_the_same_time_inside_the_worker",
        &[("OFFLOAD_JIT_WORKER_RENDEZVOUS", "2")],
    );
    assert!(out.contains("PEAK 2 COMPILES 2"), "{out}");
}

#[test]
fn keys_separate_compute_unit_kinds_and_contents() {
    let c = client();
    let ir = kernel_ir("k", 3);
    let a = c.compile(&ptx_request(ir.as_bytes())).unwrap();
    let mut req = ptx_request(ir.as_bytes());
    req.target.cpu = "sm_80".into();
    let b = c.compile(&req).unwrap();
    assert_ne!(a.image.key, b.image.key);
    assert!(String::from_utf8_lossy(&b.image.bytes).contains(".target sm_80"));
    // The same contents in a fresh buffer hit the cache: the key is the content, not the address.
    let copy = ir.clone().into_bytes();
    let cached = c.compile(&ptx_request(&copy)).unwrap();
    assert_eq!(cached.served, Served::MemoryHit);
    assert!(Arc::ptr_eq(&a.image, &cached.image));
    assert_eq!(c.stats().compiles, 2);
}

#[test]
fn bitcode_built_for_another_cpu_is_retargeted_to_the_device() {
    // clang output carries "target-cpu" attributes; the engine must generate code for the
    // device it compiles for, not for the CPU the bitcode was built for.
    let bytes = clang_bitcode(
        "saxpy",
        &["-target", PTX, "-march=sm_90"],
        &scratch("retarget").join("saxpy.bc"),
    );
    let mut req = ptx_request(&bytes);
    req.target.cpu = "sm_80".into();
    let ptx = client().compile(&req).unwrap();
    let text = String::from_utf8_lossy(&ptx.image.bytes);
    assert!(text.contains(".target sm_80"), "{text}");
    assert!(text.contains(".visible .entry saxpy("), "{text}");
}

#[test]
fn environment_variables_are_validated_and_honoured() {
    if is_child() {
        match JitConfig::from_env() {
            Err(e) => println!("ERROR: {e}"),
            Ok(c) => {
                let limits = c.limits.resolve().unwrap();
                let value = |r| offload_jit_client::limits::find(&limits, r).unwrap().value;
                use offload_jit_client::limits::Resource;
                println!(
                    "OK: opt={} skip={} cache={} isolation={:?} timeout={:?} memory={:?} \
                     cpu={:?} fsize={:?} nofile={:?}",
                    c.options.opt_level,
                    c.options.skip_opt,
                    c.cache_capacity,
                    c.isolation,
                    c.timeout.map(|t| t.value.as_secs_f64()),
                    value(Resource::AddressSpace),
                    value(Resource::CpuTime),
                    value(Resource::FileSize),
                    value(Resource::OpenFiles),
                )
            }
        }
        return;
    }
    let run =
        |vars: &[(&str, &str)]| in_child("environment_variables_are_validated_and_honoured", vars);
    for (var, value, want) in [
        ("OFFLOAD_JIT_OPT_LEVEL", "4", "0 to 3"),
        ("LIBOMPTARGET_JIT_OPT_LEVEL", "fast", "0 to 3"),
        ("OFFLOAD_JIT_SKIP_OPT", "maybe", "true/false"),
        (
            "OFFLOAD_JIT_REPLACEMENT_MODULE",
            "/no such/dir/m.bc",
            "cannot read",
        ),
        (
            "OFFLOAD_JIT_PRE_OPT_IR_MODULE",
            "/no such/dir/pre.ll",
            "does not exist",
        ),
        ("OFFLOAD_JIT_CACHE_MB", "-1", "MiB"),
        ("OFFLOAD_JIT_TIMEOUT", "soon", "seconds"),
        ("OFFLOAD_JIT_TIMEOUT", "-3", "seconds"),
        ("OFFLOAD_JIT_MEMORY_LIMIT", "12Q", "size"),
        ("OFFLOAD_JIT_MEMORY_LIMIT", "1M", "size"),
        ("OFFLOAD_JIT_CPU_LIMIT", "1.5", "whole seconds"),
        ("OFFLOAD_JIT_CPU_LIMIT", "-1", "whole seconds"),
        ("OFFLOAD_JIT_FILE_SIZE_LIMIT", "1K", "size"),
        ("OFFLOAD_JIT_OPEN_FILES_LIMIT", "3", "number of files"),
        ("OFFLOAD_JIT_OPEN_FILES_LIMIT", "many", "number of files"),
        ("OFFLOAD_JIT_ISOLATION", "sandbox", "'worker'"),
        (
            "OFFLOAD_JIT_WORKER",
            "/no such/worker",
            "no such executable",
        ),
    ] {
        let out = run(&[(var, value)]);
        assert!(
            out.contains("ERROR")
                && out.contains(&format!("{var}='{value}'"))
                && out.contains(want),
            "{var}={value}: {out}"
        );
    }
    let out = run(&[
        ("LIBOMPTARGET_JIT_OPT_LEVEL", "1"),
        ("OFFLOAD_JIT_SKIP_OPT", "true"),
        ("OFFLOAD_JIT_CACHE_MB", "8"),
        ("OFFLOAD_JIT_TIMEOUT", "2.5"),
        ("OFFLOAD_JIT_MEMORY_LIMIT", "3G"),
        ("OFFLOAD_JIT_CPU_LIMIT", "100"),
        ("OFFLOAD_JIT_FILE_SIZE_LIMIT", "64M"),
        ("OFFLOAD_JIT_OPEN_FILES_LIMIT", "200"),
        ("OFFLOAD_JIT_ISOLATION", "inprocess"),
    ]);
    assert!(
        out.contains(
            "OK: opt=1 skip=true cache=8388608 isolation=InProcess timeout=Some(2.5) memory=Some(3221225472) \
             cpu=Some(100) fsize=Some(67108864) nofile=Some(200)"
        ),
        "{out}"
    );
    let out = run(&[
        ("OFFLOAD_JIT_TIMEOUT", "0"),
        ("OFFLOAD_JIT_MEMORY_LIMIT", "none"),
    ]);
    assert!(out.contains("timeout=None memory=None"), "{out}");
    let out = run(&[
        ("OFFLOAD_JIT_OPT_LEVEL", "2"),
        ("LIBOMPTARGET_JIT_OPT_LEVEL", "0"),
    ]);
    assert!(
        out.contains("OK: opt=2"),
        "the OFFLOAD_ name wins over the alias: {out}"
    );
}

#[test]
fn dumps_replacements_and_saved_images() {
    let dir = scratch("dumps with spaces");
    let out = |name: &str| OutputPath {
        variable: format!("TEST_{name}"),
        path: dir.join(name),
    };
    let mut cfg = config();
    cfg.options.opt_level = 2;
    cfg.options.pre_opt_ir = Some(out("pre opt.ll"));
    cfg.options.post_opt_ir = Some(out("post.ll"));
    cfg.save_image_dir = Some(OutputPath {
        variable: "TEST_SAVE".into(),
        path: dir.clone(),
    });
    cfg.options.replacement_module = Some(offload_core::jit::NamedFile {
        variable: "TEST_REPLACEMENT".into(),
        path: "r.ll".into(),
        bytes: kernel_ir("replaced", 99).into_bytes(),
    });
    let compiled = client_with(cfg)
        .compile(&ptx_request(kernel_ir("original", 1).as_bytes()))
        .unwrap();
    let ptx = String::from_utf8_lossy(&compiled.image.bytes).into_owned();
    assert!(
        ptx.contains(".entry replaced(") && !ptx.contains("original"),
        "{ptx}"
    );
    let pre = std::fs::read_to_string(dir.join("pre opt.ll")).unwrap();
    assert!(pre.contains("define ptx_kernel void @replaced"), "{pre}");
    assert!(
        std::fs::read_to_string(dir.join("post.ll"))
            .unwrap()
            .contains("@replaced")
    );
    let saved = dir.join(format!("{}.ptx", compiled.image.key.hex()));
    assert_eq!(std::fs::read(saved).unwrap(), compiled.image.bytes);

    let mut cfg = config();
    cfg.options.replacement_object = Some(offload_core::jit::NamedFile {
        variable: "TEST_OBJECT".into(),
        path: "o".into(),
        bytes: b"replacement output".to_vec(),
    });
    let c = client_with(cfg)
        .compile(&ptx_request(kernel_ir("x", 1).as_bytes()))
        .unwrap();
    assert_eq!(c.image.bytes, b"replacement output");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_compile_counter_is_exact_under_repeated_requests() {
    let c = client();
    for _ in 0..50 {
        c.compile(&ptx_request(kernel_ir("again", 8).as_bytes()))
            .unwrap();
    }
    assert_eq!(c.stats().compiles, 1);
    assert_eq!(c.stats().memory_hits, 49);
}

#[test]
fn in_process_mode_gives_the_same_output_as_the_worker() {
    let ir = kernel_ir("same", 11);
    let through_worker = client().compile(&ptx_request(ir.as_bytes())).unwrap();
    let in_process = client_with(JitConfig {
        isolation: Isolation::InProcess,
        ..config()
    });
    let here = in_process.compile(&ptx_request(ir.as_bytes())).unwrap();
    assert_eq!(here.image.bytes, through_worker.image.bytes);
    assert_eq!(
        in_process.worker_stats().starts,
        0,
        "no worker in in-process mode"
    );
    assert_eq!(in_process.worker_pid(), None);
}

/// 6a: IR is recognised by its first top-level entity, whatever comes before it.
#[test]
fn ir_that_starts_with_comments_globals_or_declarations_is_ir() {
    let c = client();
    let body = "define ptx_kernel void @k(ptr %p) {\n  store i32 1, ptr %p\n  ret void\n}\n";
    let triple = "target triple = \"nvptx64-nvidia-cuda\"\n";
    let long_comment = format!("; {}\n{triple}", "x".repeat(8000));
    // LLVM's CodeGen tests start like these; a module without a triple line is compiled for
    // the device's triple.
    let starts = [
        format!("; RUN: llc < %s -march=nvptx64 | FileCheck %s\n; CHECK: .entry\n\n{triple}"),
        long_comment,
        "@g = internal addrspace(1) global i32 0\n".to_string(),
        "declare i32 @llvm.nvvm.read.ptx.sreg.tid.x()\n".to_string(),
        "%struct.S = type { i32, float }\n".to_string(),
        "; \u{e9}t\u{e9} in a comment\n!0 = !{i32 1}\n".to_string(),
        "$c = comdat any\n".to_string(),
        format!("\n\n   \t\n{triple}"),
    ];
    for start in starts {
        let ir = format!("{start}{body}");
        let out = c
            .compile(&ptx_request(ir.as_bytes()))
            .unwrap_or_else(|e| panic!("{start:?}: {e}"));
        assert!(String::from_utf8_lossy(&out.image.bytes).contains(".entry k("));
    }
    // A comment-only file is an empty module (see the oracle tests); prose, binary data after
    // a `;`, and blank text are not IR.
    for not_ir in [
        "hello world\n",
        "defined behaviour\n",
        "; a comment\n\0\x01binary",
        ";\x7f\n",
        "  \n\n",
    ] {
        let e = c.compile(&ptx_request(not_ir.as_bytes())).unwrap_err();
        assert!(e.to_string().contains("neither LLVM bitcode"), "{e}");
    }
}

fn llc(args: &[&str], input: &Path) -> Vec<u8> {
    let out = std::process::Command::new("llc-19")
        .args(args)
        .arg(input)
        .args(["-o", "-"])
        .output()
        .expect("llc-19");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// 6b: a module without a data layout is parsed with the target's (alignment of `load i64`).
#[test]
fn ir_without_a_data_layout_is_parsed_with_the_targets() {
    let dir = scratch("layout");
    let ir = "target triple = \"nvptx64-nvidia-cuda\"\ndefine ptx_kernel void @k(ptr %p, ptr %q) {\n  %v = load i64, ptr %p\n  store i64 %v, ptr %q\n  ret void\n}\n";
    let path = dir.join("k.ll");
    std::fs::write(&path, ir).unwrap();
    let mut cfg = config();
    cfg.options.skip_opt = true;
    cfg.options.opt_level = 2;
    let ours = client_with(cfg)
        .compile(&ptx_request(ir.as_bytes()))
        .unwrap();
    let theirs = llc(&["-O2", "-mcpu=sm_90", "-asm-verbose=false"], &path);
    assert_eq!(
        String::from_utf8_lossy(&ours.image.bytes),
        String::from_utf8_lossy(&theirs)
    );
    // With LLVM's default layout the load would be `align 4` and split in two 32-bit loads.
    let text = String::from_utf8_lossy(&ours.image.bytes);
    assert!(
        text.contains("ld.global.u64") && !text.contains("ld.global.u32"),
        "{text}"
    );
}

/// 6c: static constructors land in `.init_array`, which the dynamic loader runs.
#[test]
fn static_constructors_land_in_init_array() {
    use object::{Object, ObjectSection};
    let ir = "target triple = \"x86_64-unknown-linux-gnu\"\n@state = global i32 0\n@llvm.global_ctors = appending global [1 x { i32, ptr, ptr }] [{ i32, ptr, ptr } { i32 65535, ptr @init, ptr null }]\ndefine internal void @init() {\n  store volatile i32 7, ptr @state\n  ret void\n}\ndefine void @k(ptr %out) {\n  %v = load i32, ptr @state\n  store i32 %v, ptr %out\n  ret void\n}\n";
    let so = client()
        .compile(&CompileRequest {
            image: ir.as_bytes(),
            target: target(HOST, "x86-64", ""),
            post: PostProcess::LinkHostSharedObject,
        })
        .unwrap();
    let file = object::File::parse(&*so.image.bytes).unwrap();
    let names: Vec<&str> = file.sections().filter_map(|s| s.name().ok()).collect();
    assert!(names.contains(&".init_array"), "{names:?}");
    assert!(!names.contains(&".ctors"), "{names:?}");
}

/// 6d: feature names are normalised and checked against the target.
#[test]
fn target_features_are_normalised_and_unknown_ones_refused() {
    let c = client();
    let amd_ir = "target triple = \"amdgcn-amd-amdhsa\"\ndefine amdgpu_kernel void @k(ptr addrspace(1) %p) {\n  store i32 1, ptr addrspace(1) %p\n  ret void\n}\n";
    let amd = |features: &str| CompileRequest {
        image: amd_ir.as_bytes(),
        target: target("amdgcn-amd-amdhsa", "gfx90a", features),
        post: PostProcess::Unchanged,
    };
    let bare = c.compile(&amd("si-scheduler")).unwrap();
    let signed = c.compile(&amd("+si-scheduler")).unwrap();
    assert_eq!(
        bare.image.bytes, signed.image.bytes,
        "a bare name means +name"
    );
    for (features, named) in [
        ("+nonsense", "+nonsense"),
        ("+help", "+help"),
        ("help", "help"),
        ("+xnack,-bogus", "-bogus"),
        ("+", "+"),
    ] {
        let e = c.compile(&amd(features)).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains("unknown target feature") && text.contains(named),
            "{features}: {text}"
        );
        assert!(
            text.contains("xnack"),
            "the error lists the known features: {text}"
        );
    }
}

/// 6e: a function that asks for a feature the device lacks is refused, not miscompiled.
#[test]
fn functions_requiring_features_the_device_lacks_are_refused() {
    let c = client();
    let ir = "target triple = \"x86_64-unknown-linux-gnu\"\ndefine void @wide(ptr %p) #0 {\n  store i32 1, ptr %p\n  ret void\n}\nattributes #0 = { \"target-features\"=\"+avx512f,+avx2\" }\n";
    let req = |features: &str| CompileRequest {
        image: ir.as_bytes(),
        target: target(HOST, "x86-64", features),
        post: PostProcess::Unchanged,
    };
    let e = c.compile(&req("+avx2,-avx512f")).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("function 'wide'") && text.contains("+avx512f") && !text.contains("+avx2,"),
        "{text}"
    );
    c.compile(&req("+avx2,+avx512f")).unwrap();
    // A device list that does not mention the feature leaves the CPU's default in force.
    c.compile(&req("")).unwrap();
}

/// 6f: a module without a triple is compiled for the device's; other targets' intrinsics are
/// refused before code generation.
#[test]
fn modules_without_a_triple_and_foreign_intrinsics() {
    let c = client();
    let no_triple = "define ptx_kernel void @k(ptr %p) {\n  store i32 5, ptr %p\n  ret void\n}\n";
    let out = c.compile(&ptx_request(no_triple.as_bytes())).unwrap();
    assert!(String::from_utf8_lossy(&out.image.bytes).contains(".entry k("));
    let nvvm_in_x86 = "declare i32 @llvm.nvvm.read.ptx.sreg.tid.x()\ndefine void @k(ptr %p) {\n  %t = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()\n  store i32 %t, ptr %p\n  ret void\n}\n";
    for triple_line in ["", "target triple = \"x86_64-unknown-linux-gnu\"\n"] {
        let ir = format!("{triple_line}{nvvm_in_x86}");
        let e = c
            .compile(&CompileRequest {
                image: ir.as_bytes(),
                target: target(HOST, "x86-64", ""),
                post: PostProcess::LinkHostSharedObject,
            })
            .unwrap_err();
        assert!(
            e.to_string().contains("llvm.nvvm.read.ptx.sreg.tid.x")
                && e.to_string().contains("nvptx"),
            "{e}"
        );
    }
    assert_eq!(c.worker_stats().deaths, 0);
}

/// 6g and 6h: the linker is found and checked once per worker, and links use no file: the
/// object arrives as /proc/self/fd/N (a memfd) and the image leaves on stdout.
#[test]
fn the_linker_is_checked_once_and_links_write_no_files() {
    if is_child() {
        let c = client();
        for i in 0..3 {
            let ir = format!(
                "target triple = \"x86_64-unknown-linux-gnu\"\ndefine void @k{i}(ptr %p) {{\n  store i32 {i}, ptr %p\n  ret void\n}}\n"
            );
            c.compile(&CompileRequest {
                image: ir.as_bytes(),
                target: target(HOST, "x86-64", ""),
                post: PostProcess::LinkHostSharedObject,
            })
            .unwrap();
        }
        println!("DONE");
        return;
    }
    let dir = scratch("lld-log");
    let log = dir.join("calls.log");
    let wrapper = dir.join("ld.lld");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\necho \"$@\" >> '{}'\nexec /usr/lib/llvm-19/bin/ld.lld \"$@\"\n",
            log.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let tmp_before: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .collect();
    let out = in_child(
        "the_linker_is_checked_once_and_links_write_no_files",
        &[("OFFLOAD_LLD", wrapper.to_str().unwrap())],
    );
    assert!(out.contains("DONE"), "{out}");
    let calls = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = calls.lines().collect();
    assert_eq!(
        lines.iter().filter(|l| l.contains("--version")).count(),
        1,
        "{calls}"
    );
    let links: Vec<&&str> = lines.iter().filter(|l| l.contains("-shared")).collect();
    assert_eq!(links.len(), 3, "{calls}");
    for l in links {
        assert!(l.contains("-o -") && l.contains("/proc/self/fd/"), "{l}");
    }
    let new_tmp: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .filter(|n| {
            !tmp_before.contains(n)
                && n.to_string_lossy().contains("offload-jit-")
                && n.to_string_lossy().ends_with(".o")
        })
        .collect();
    assert!(new_tmp.is_empty(), "{new_tmp:?}");
    // A bad OFFLOAD_LLD names the variable.
    let out = in_child(
        "the_linker_is_checked_once_and_links_write_no_files",
        &[("OFFLOAD_LLD", "/no/such/ld.lld")],
    );
    assert!(out.contains("OFFLOAD_LLD='/no/such/ld.lld'"), "{out}");
}
