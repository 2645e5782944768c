//! The engine's behaviour apart from code quality: bad inputs give clear errors and the process
//! survives, the cache compiles once per key and in parallel across keys, and the environment
//! variables are honoured and validated.

use offload_core::Error;
use offload_jit::{CompileEvent, JitConfig, JitEngine, JitTarget, Served, Unchanged};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

const PTX: &str = "nvptx64-nvidia-cuda";

fn sm90() -> JitTarget {
    JitTarget {
        compute_unit_kind: "sm_90".into(),
        features: String::new(),
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

fn engine() -> JitEngine {
    JitEngine::with_config(PTX, JitConfig::default()).unwrap()
}

#[test]
fn textual_ir_and_bitcode_are_both_accepted() {
    let e = engine();
    let out = e
        .compile(kernel_ir("k", 42).as_bytes(), &sm90(), &Unchanged)
        .unwrap();
    let ptx = String::from_utf8(out.image.bytes.clone()).unwrap();
    assert!(ptx.contains(".visible .entry k("), "{ptx}");
    assert!(ptx.contains("42"), "{ptx}");
    assert_eq!(out.served, Served::Compiled);
    assert!(e.check_image(kernel_ir("k", 1).as_bytes()).is_ok());
}

#[test]
fn bad_inputs_give_clear_errors_and_the_process_survives() {
    let e = engine();
    let t = sm90();
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
        ("not IR at all", b"\x7fELF this is not bitcode".to_vec(), "neither LLVM bitcode nor textual IR"),
    ];
    for (case, bytes, want) in cases {
        let err = e.compile(&bytes, &t, &Unchanged).unwrap_err();
        assert!(
            err.to_string().contains(want),
            "{case}: '{err}' should contain '{want}'"
        );
        assert!(
            matches!(err, Error::InvalidImage(_) | Error::CompileFailure(_)),
            "{case}: {err:?}"
        );
    }
    // Verification failures that the parser accepts are reported by the verifier.
    let unverifiable = b"target triple = \"nvptx64-nvidia-cuda\"\ndefine void @f() {\nentry:\n  br label %next\nnext:\n  %v = phi i32 [ 1, %other ]\n  ret void\nother:\n  ret void\n}\n";
    let err = e.compile(unverifiable, &t, &Unchanged).unwrap_err();
    assert!(
        err.to_string().contains("invalid LLVM IR") || err.to_string().contains("verification"),
        "{err}"
    );

    // A CPU the target does not know is refused before code generation, listing the known ones.
    let bad_cpu = JitTarget {
        compute_unit_kind: "sm_9000".into(),
        features: String::new(),
    };
    let err = e
        .compile(kernel_ir("k", 1).as_bytes(), &bad_cpu, &Unchanged)
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert!(
        err.to_string().contains("CPU 'sm_9000'") && err.to_string().contains("sm_90"),
        "{err}"
    );
    // The engine is still fine afterwards.
    e.compile(kernel_ir("k", 7).as_bytes(), &t, &Unchanged)
        .unwrap();
    assert_eq!(e.stats().failures, 9);

    // check_image routes by triple.
    let other = b"target triple = \"x86_64-unknown-linux-gnu\"\n";
    let err = e.check_image(other).unwrap_err();
    assert!(
        err.to_string()
            .contains("bitcode is for 'x86_64-unknown-linux-gnu'"),
        "{err}"
    );
    // An unknown target triple for the engine itself.
    assert!(JitEngine::with_config("sparc-sun-solaris", JitConfig::default()).is_err());
}

#[test]
fn sixteen_threads_asking_for_the_same_key_compile_once() {
    let e = Arc::new(engine());
    let ir = kernel_ir("shared", 5);
    std::thread::scope(|s| {
        for _ in 0..16 {
            let (e, ir) = (e.clone(), ir.clone());
            s.spawn(move || e.compile(ir.as_bytes(), &sm90(), &Unchanged).unwrap());
        }
    });
    let st = e.stats();
    assert_eq!(st.compiles, 1, "{st:?}");
    assert_eq!(st.memory_hits + st.shared_waits, 15, "{st:?}");
}

#[test]
fn different_keys_compile_at_the_same_time() {
    // Each compile blocks in the observer until two compiles are in flight at once. If the
    // engine serialised compiles, the second could never start while the first waits, and the
    // wait would time out: the test observes overlap instead of timing it.
    let e = Arc::new(engine());
    let state = Arc::new((Mutex::new((0u32, 0u32)), Condvar::new()));
    let observed = state.clone();
    e.set_observer(move |event| {
        let (m, cv) = &*observed;
        let mut g = m.lock().unwrap();
        if let CompileEvent::Started(_) = event {
            g.0 += 1;
            g.1 = g.1.max(g.0);
            cv.notify_all();
            let (g2, _) = cv
                .wait_timeout_while(g, Duration::from_secs(20), |g| g.1 < 2)
                .unwrap();
            drop(g2);
        } else {
            g.0 -= 1;
        }
    });
    std::thread::scope(|s| {
        for (name, v) in [("a", 1), ("b", 2)] {
            let e = e.clone();
            s.spawn(move || {
                e.compile(kernel_ir(name, v).as_bytes(), &sm90(), &Unchanged)
                    .unwrap()
            });
        }
    });
    assert_eq!(
        state.0.lock().unwrap().1,
        2,
        "both compiles must have been in flight together"
    );
    assert_eq!(e.stats().peak_in_flight, 2);
    assert_eq!(e.stats().compiles, 2);
}

#[test]
fn keys_separate_compute_unit_kinds_and_contents() {
    let e = engine();
    let ir = kernel_ir("k", 3);
    let a = e.compile(ir.as_bytes(), &sm90(), &Unchanged).unwrap();
    let sm80 = JitTarget {
        compute_unit_kind: "sm_80".into(),
        features: String::new(),
    };
    let b = e.compile(ir.as_bytes(), &sm80, &Unchanged).unwrap();
    assert_ne!(a.image.key, b.image.key);
    assert!(String::from_utf8_lossy(&b.image.bytes).contains(".target sm_80"));
    // The same contents in a fresh buffer hit the cache: the key is the content, not the address.
    let copy = ir.clone().into_bytes();
    let c = e.compile(&copy, &sm90(), &Unchanged).unwrap();
    assert_eq!(c.served, Served::MemoryHit);
    assert!(Arc::ptr_eq(&a.image, &c.image));
    assert_eq!(e.stats().compiles, 2);
}

#[test]
fn bitcode_built_for_another_cpu_is_retargeted_to_the_device() {
    // clang output carries "target-cpu" attributes; the engine must generate code for the
    // device it compiles for, not for the CPU the bitcode was built for.
    let dir = std::env::temp_dir().join(format!("offload-jit-retarget-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bc = dir.join("saxpy.bc");
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let status = std::process::Command::new("clang-19")
        .args([
            "-O2",
            "-emit-llvm",
            "-c",
            "-target",
            "nvptx64-nvidia-cuda",
            "-march=sm_90",
            "-I",
        ])
        .arg(repo.join("include"))
        .arg(repo.join("kernels/saxpy.c"))
        .arg("-o")
        .arg(&bc)
        .status()
        .expect("clang-19");
    assert!(status.success());
    let bytes = std::fs::read(&bc).unwrap();
    let e = engine();
    let sm80 = JitTarget {
        compute_unit_kind: "sm_80".into(),
        features: String::new(),
    };
    let ptx = e.compile(&bytes, &sm80, &Unchanged).unwrap();
    let text = String::from_utf8_lossy(&ptx.image.bytes);
    assert!(text.contains(".target sm_80"), "{text}");
    assert!(text.contains(".visible .entry saxpy("), "{text}");
}

#[test]
fn environment_variables_are_validated_and_honoured() {
    // Each case runs in a child process so the variables never leak into other tests.
    if let Ok(case) = std::env::var("OFFLOAD_JIT_ENGINE_TEST_CASE") {
        let r = JitConfig::from_env();
        match case.as_str() {
            "bad-opt" | "bad-skip" | "missing-replacement" | "bad-dump-dir" | "bad-cache" => {
                let e = r.unwrap_err();
                println!("ERROR: {e}");
            }
            _ => {
                let c = r.unwrap();
                println!(
                    "OK: opt={} skip={} cache={}",
                    c.opt_level, c.skip_opt, c.cache_capacity
                );
            }
        }
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let run = |case: &str, vars: &[(&str, &str)]| -> String {
        let mut cmd = std::process::Command::new(&exe);
        cmd.args([
            "--exact",
            "environment_variables_are_validated_and_honoured",
            "--nocapture",
            "--test-threads=1",
        ]);
        for v in [
            "OFFLOAD_JIT_OPT_LEVEL",
            "LIBOMPTARGET_JIT_OPT_LEVEL",
            "OFFLOAD_JIT_SKIP_OPT",
            "LIBOMPTARGET_JIT_SKIP_OPT",
            "OFFLOAD_JIT_CACHE_MB",
        ] {
            cmd.env_remove(v);
        }
        cmd.env("OFFLOAD_JIT_ENGINE_TEST_CASE", case);
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let out = run("bad-opt", &[("OFFLOAD_JIT_OPT_LEVEL", "4")]);
    assert!(
        out.contains("ERROR")
            && out.contains("OFFLOAD_JIT_OPT_LEVEL='4'")
            && out.contains("0 to 3"),
        "{out}"
    );
    let out = run("bad-opt", &[("LIBOMPTARGET_JIT_OPT_LEVEL", "fast")]);
    assert!(out.contains("LIBOMPTARGET_JIT_OPT_LEVEL='fast'"), "{out}");
    let out = run("bad-skip", &[("OFFLOAD_JIT_SKIP_OPT", "maybe")]);
    assert!(out.contains("OFFLOAD_JIT_SKIP_OPT='maybe'"), "{out}");
    let out = run(
        "missing-replacement",
        &[("OFFLOAD_JIT_REPLACEMENT_MODULE", "/no such/dir/m.bc")],
    );
    assert!(
        out.contains("OFFLOAD_JIT_REPLACEMENT_MODULE='/no such/dir/m.bc'"),
        "{out}"
    );
    let out = run(
        "bad-dump-dir",
        &[("OFFLOAD_JIT_PRE_OPT_IR_MODULE", "/no such/dir/pre.ll")],
    );
    assert!(
        out.contains("OFFLOAD_JIT_PRE_OPT_IR_MODULE") && out.contains("does not exist"),
        "{out}"
    );
    let out = run("bad-cache", &[("OFFLOAD_JIT_CACHE_MB", "-1")]);
    assert!(out.contains("OFFLOAD_JIT_CACHE_MB='-1'"), "{out}");
    let out = run(
        "good",
        &[
            ("LIBOMPTARGET_JIT_OPT_LEVEL", "1"),
            ("OFFLOAD_JIT_SKIP_OPT", "true"),
            ("OFFLOAD_JIT_CACHE_MB", "8"),
        ],
    );
    assert!(out.contains("OK: opt=1 skip=true cache=8388608"), "{out}");
    let out = run(
        "good",
        &[
            ("OFFLOAD_JIT_OPT_LEVEL", "2"),
            ("LIBOMPTARGET_JIT_OPT_LEVEL", "0"),
        ],
    );
    assert!(
        out.contains("OK: opt=2"),
        "the OFFLOAD_ name wins over the alias: {out}"
    );
}

#[test]
fn dumps_replacements_and_saved_images() {
    let dir = std::env::temp_dir().join(format!("offload jit dumps {}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = |name: &str| offload_jit::config::OutputPath {
        variable: format!("TEST_{name}"),
        path: dir.join(name),
    };
    let replacement = kernel_ir("replaced", 99);
    let config = JitConfig {
        opt_level: 2,
        pre_opt_ir: Some(out("pre opt.ll")),
        post_opt_ir: Some(out("post.ll")),
        save_image_dir: Some(offload_jit::config::OutputPath {
            variable: "TEST_SAVE".into(),
            path: dir.clone(),
        }),
        replacement_module: Some(offload_jit::config::NamedFile {
            variable: "TEST_REPLACEMENT".into(),
            path: "r.ll".into(),
            bytes: replacement.into_bytes(),
        }),
        ..JitConfig::default()
    };
    let e = JitEngine::with_config(PTX, config).unwrap();
    let compiled = e
        .compile(kernel_ir("original", 1).as_bytes(), &sm90(), &Unchanged)
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

    let object = JitConfig {
        replacement_object: Some(offload_jit::config::NamedFile {
            variable: "TEST_OBJECT".into(),
            path: "o".into(),
            bytes: b"replacement output".to_vec(),
        }),
        ..JitConfig::default()
    };
    let e = JitEngine::with_config(PTX, object).unwrap();
    let c = e
        .compile(kernel_ir("x", 1).as_bytes(), &sm90(), &Unchanged)
        .unwrap();
    assert_eq!(c.image.bytes, b"replacement output");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_compile_counter_is_exact_under_repeated_requests() {
    let e = engine();
    let counter = Arc::new(AtomicU32::new(0));
    let c = counter.clone();
    e.set_observer(move |ev| {
        if matches!(ev, CompileEvent::Started(_)) {
            c.fetch_add(1, Ordering::SeqCst);
        }
    });
    for _ in 0..50 {
        e.compile(kernel_ir("again", 8).as_bytes(), &sm90(), &Unchanged)
            .unwrap();
    }
    assert_eq!(counter.load(Ordering::SeqCst), 1);
    assert_eq!(e.stats().memory_hits, 49);
}
