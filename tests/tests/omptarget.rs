//! The drop-in `libomptarget.so.19.1` (`crates/omptarget`): its name and exports are LLVM 19's,
//! OpenMP programs built by clang-19 run on it with their target regions on the host plugin
//! (built against it, or against Debian's library and run on ours), the offload policy is
//! honoured, and descriptors that are malformed are an error, not a crash.
//!
//! Needs clang-19 and libomp-19-dev (scripts/setup.sh installs them).

use offload_tests::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn library_dir() -> PathBuf {
    omptarget_dir()
}

/// Builds `tests/omp/<name>` (`.c`, or `.cpp` as C++) with clang-19 for x86-64 offloading,
/// linked against the libomptarget in `lib` (with an rpath to it), plus `extra` flags.
fn build(name: &str, lib: &Path, extra: &[&str], tag: &str) -> PathBuf {
    let stem = name.split('.').next().unwrap();
    let out = scratch("omptarget").join(format!("{stem}-{tag}"));
    let file = if name.contains('.') {
        name.to_string()
    } else {
        format!("{name}.c")
    };
    omp_program(&repo_root().join("tests/omp").join(file), &out, lib, extra);
    out
}

/// C `source`, written to the scratch directory as `<stem>.c`, built by clang-19 against our
/// library with `flags` (OpenMP's, or `-lomptarget` for a program that calls the ABI itself).
fn build_source(stem: &str, source: &str, flags: &[&str]) -> PathBuf {
    let lib = library_dir();
    let src = scratch("omptarget").join(format!("{stem}.c"));
    std::fs::write(&src, source).unwrap();
    let program = scratch("omptarget").join(stem);
    let (l, rpath) = (
        format!("-L{}", lib.display()),
        format!("-Wl,-rpath,{}", lib.display()),
    );
    let mut args = vec![
        src.to_str().unwrap(),
        "-o",
        program.to_str().unwrap(),
        &l,
        &rpath,
    ];
    args.extend(flags);
    clang(&args);
    program
}

fn run(program: &Path, envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(program);
    cmd.env_remove("OMP_TARGET_OFFLOAD")
        .env_remove("LIBOMPTARGET_INFO")
        .env_remove("OFFLOAD_OMP_HOST_DEVICES");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().expect("run the OpenMP program")
}

fn passed(out: &Output, what: &str) -> String {
    let text = stdout(out);
    assert!(
        out.status.success() && text.ends_with("PASSED\n") && !text.contains("FAIL"),
        "{what}: status {:?}\nstdout:\n{text}\nstderr:\n{}",
        out.status,
        stderr(out)
    );
    text
}

#[test]
fn the_library_has_llvm_19s_name_and_exports() {
    let lib = library_dir().join("libomptarget.so.19.1");
    let dynamic = Command::new("readelf")
        .args(["-d"])
        .arg(&lib)
        .output()
        .unwrap();
    assert!(
        stdout(&dynamic).contains("Library soname: [libomptarget.so.19.1]"),
        "{}",
        stdout(&dynamic)
    );
    let syms = Command::new("readelf")
        .args(["--dyn-syms", "-W"])
        .arg(&lib)
        .output()
        .unwrap();
    let syms = stdout(&syms);
    // The reference is Debian's own library, not our map: its defined C symbols (the two C++
    // OMPT internals its plugins share are not an interface of programs; `VERS1.0` is the
    // version node's own symbol).
    let defined = |lib: &Path| -> Vec<String> {
        let out = Command::new("nm")
            .args(["-D", "--defined-only"])
            .arg(lib)
            .output()
            .expect("run nm");
        assert!(
            out.status.success(),
            "nm {}: {}",
            lib.display(),
            stderr(&out)
        );
        let mut names: Vec<String> = stdout(&out)
            .lines()
            .filter_map(|l| l.split_whitespace().nth(2))
            // `name@@VERS1.0`: the name.
            .filter_map(|n| n.split('@').next())
            .filter(|n| !n.starts_with("_Z") && *n != "VERS1.0")
            .map(str::to_string)
            .collect();
        names.sort();
        names
    };
    let debians = defined(Path::new("/usr/lib/llvm-19/lib/libomptarget.so.19.1"));
    let ours = defined(&lib);
    assert_eq!(debians.len(), 71, "Debian's C exports: {debians:?}");
    assert_eq!(ours, debians, "our C exports differ from Debian's");
    for n in &debians {
        let versioned = syms.lines().any(|l| {
            l.split_whitespace().last() == Some(&format!("{n}@@VERS1.0")) && !l.contains(" UND ")
        });
        assert!(versioned, "{n} is not defined as {n}@@VERS1.0");
    }
}

/// The library's environment is a front door too: seeded random values of its variables
/// (numbers in and out of range, negative, huge, junk, empty) never crash the program; a bad
/// value is named in a message (variable and value) and the program runs on with the default.
#[test]
fn random_values_of_the_librarys_variables_run_or_are_named() {
    let lib = library_dir();
    let program = build("smoke", &lib, &[], "ours");
    let out = run(&program, &[("OFFLOAD_OMP_HOST_DEVICES", "abc")]);
    let (text, err) = (stdout(&out), stderr(&out));
    assert!(
        out.status.success() && text.contains("devices 4"),
        "{text}{err}"
    );
    assert!(
        err.contains("OFFLOAD_OMP_HOST_DEVICES='abc' is not valid") && err.contains("using 4"),
        "{err}"
    );
    let seed: u64 = std::env::var("OFFLOAD_TEST_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x0e7a);
    let mut s = seed | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let names = [
        "OFFLOAD_OMP_HOST_DEVICES",
        "LIBOMPTARGET_MEMORY_MANAGER_THRESHOLD",
        "LIBOMPTARGET_QUERY_COUNT_MAX",
        "LIBOMPTARGET_QUERY_COUNT_THRESHOLD",
        "LIBOMPTARGET_QUERY_COUNT_BACKOFF_FACTOR",
        "OMP_NUM_TEAMS",
        "OMP_TEAMS_THREAD_LIMIT",
        "LIBOMPTARGET_SHARED_MEMORY_SIZE",
        "LIBOMPTARGET_HEAP_SIZE",
        "LIBOMPTARGET_REUSE_BLOCKS_FOR_HIGH_TRIP_COUNT",
        "OFFLOAD_INFO",
        "LIBOMPTARGET_INFO",
    ];
    let values = [
        "0",
        "1",
        "3",
        "64",
        "65",
        "-1",
        "1e3",
        "0.5",
        "nan",
        "18446744073709551616",
        "4K",
        "x",
        "",
        " 2 ",
        "true",
        "ON",
        "\u{e9}t\u{e9}",
    ];
    // Read on every run of this host program: a value that is no number and no mask must be
    // named (the others are read only on a GPU or at a nowait query).
    let read_here = [
        "OFFLOAD_OMP_HOST_DEVICES",
        "LIBOMPTARGET_MEMORY_MANAGER_THRESHOLD",
        "OFFLOAD_INFO",
        "LIBOMPTARGET_INFO",
    ];
    for name in read_here {
        let out = run(&program, &[(name, "x")]);
        let all = format!("{}{}", stdout(&out), stderr(&out));
        assert!(
            all.contains(&format!("{name}='x'")) || all.contains(&format!("{name}=x")),
            "{name}='x' was not named:\n{all}"
        );
    }
    for trial in 0..16 {
        let name = names[next() as usize % names.len()];
        let value = values[next() as usize % values.len()];
        let out = run(&program, &[(name, value)]);
        let (text, err) = (stdout(&out), stderr(&out));
        let what = format!("seed {seed:#x} trial {trial}: {name}='{value}'");
        // Ends on its own (never a signal), and runs its regions, or stops with one named
        // error (a diagnostics variable the runtime refuses before any region).
        assert!(
            out.status.code().is_some(),
            "{what}: {:?}\n{err}",
            out.status
        );
        if !out.status.success() {
            assert!(
                err.contains(name),
                "{what}: failed without naming it:\n{text}{err}"
            );
            continue;
        }
        assert!(text.contains("ok offloaded"), "{what}:\n{text}{err}");
        for line in err.lines().filter(|l| l.contains("is not valid")) {
            assert!(line.contains(name), "{what}: {line}");
        }
    }
}

#[test]
fn openmp_programs_run_their_target_regions_on_the_host_plugin() {
    let lib = library_dir();
    let program = build("smoke", &lib, &[], "ours");
    let out = run(&program, &[]);
    let text = passed(&out, "smoke on ours");
    assert!(
        text.contains("ok offloaded") && text.contains("devices 4"),
        "{text}"
    );
    // The number of host devices is ours to configure.
    let out = run(&program, &[("OFFLOAD_OMP_HOST_DEVICES", "2")]);
    assert!(passed(&out, "2 devices").contains("devices 2"));
}

#[test]
fn cxx_target_regions_run_aot_and_jit_compiled() {
    let lib = library_dir();
    // -O0 keeps the landing pads, so the image takes __gxx_personality_v0 from libstdc++,
    // which the program has loaded and the plugin's trial-load process has not.
    for (tag, extra) in [("aot", &[][..]), ("jit", &["-fopenmp-target-jit"][..])] {
        let mut flags = vec!["-O0"];
        flags.extend(extra);
        let program = build("cxx.cpp", &lib, &flags, tag);
        let cache = scratch("omptarget").join(format!("cxx-cache-{tag}"));
        let out = run(&program, &[("OFFLOAD_CACHE_DIR", cache.to_str().unwrap())]);
        passed(&out, &format!("cxx.cpp, {tag}"));
    }
}

/// JIT mode (`-fopenmp-target-jit`: the device code is x86-64 bitcode, which upstream's
/// library cannot compile): the first run compiles it in the JIT worker, the second process is
/// served from the disk cache, and a region's kernel is called the OpenMP way (launch
/// environment, then one word per argument, fewer parameters than words included).
#[test]
fn jit_mode_programs_compile_once_and_a_second_process_reads_the_disk_cache() {
    let lib = library_dir();
    let program = build("smoke", &lib, &["-fopenmp-target-jit"], "jit");
    let cache = scratch("omptarget").join("jit-cache");
    // Cargo's environment turns the disk cache off (.cargo/config.toml); this one is the
    // test's own.
    let envs = [
        ("OFFLOAD_CACHE", "1"),
        ("OFFLOAD_CACHE_DIR", cache.to_str().unwrap()),
        ("OFFLOAD_INFO", "jit"),
    ];
    let first = run(&program, &envs);
    let text = passed(&first, "smoke, JIT mode, first run");
    assert!(text.contains("ok offloaded"), "{text}");
    let said = stderr(&first);
    assert!(
        said.contains("compiled in") && !said.contains("read from the disk cache"),
        "{said}"
    );
    let second = run(&program, &envs);
    passed(&second, "smoke, JIT mode, second run");
    let said = stderr(&second);
    assert!(
        said.contains("read from the disk cache") && !said.contains("compiled in"),
        "{said}"
    );
}

/// Target regions from 8 threads at once: each thread's own data and data regions, a shared
/// array kept mapped by the main thread (`present`), and a `declare target` counter updated
/// atomically from every thread.
#[test]
fn target_regions_from_several_threads_at_once() {
    let lib = library_dir();
    let program = build("threads", &lib, &["-lpthread"], "ours");
    for _ in 0..3 {
        let out = run(&program, &[]);
        assert!(passed(&out, "threads").contains("hits 1600"));
    }
}

/// Several translation units and several images: the program (two translation units, each
/// with target regions and globals) offloads in a loop while another thread opens and closes
/// a shared library with its own image 40 times, so that registrations and unregistrations
/// (run by the dynamic loader, under its lock) meet constructs that load images (a dlopen).
/// Upstream's library deadlocks here (measured: its registration waits for its lock under the
/// loader's lock while the offloading thread holds it and waits for the loader's).
#[test]
fn a_library_comes_and_goes_while_another_thread_offloads() {
    let lib = library_dir();
    let dir = scratch("omptarget");
    let omp = repo_root().join("tests/omp");
    let so = dir.join("liblib_region.so");
    let l = format!("-L{}", lib.display());
    let rpath = format!("-Wl,-rpath,{}", lib.display());
    let common = [
        "-fopenmp",
        "-fopenmp-targets=x86_64-pc-linux-gnu",
        "-O1",
        l.as_str(),
        rpath.as_str(),
    ];
    let mut args: Vec<&str> = common.to_vec();
    let src = omp.join("lib_region.c");
    args.extend([
        "-fPIC",
        "-shared",
        src.to_str().unwrap(),
        "-o",
        so.to_str().unwrap(),
    ]);
    clang(&args);
    let program = dir.join("images");
    let (a, b) = (omp.join("images.c"), omp.join("images_b.c"));
    let mut args: Vec<&str> = common.to_vec();
    args.extend([
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "-o",
        program.to_str().unwrap(),
        "-ldl",
        "-lpthread",
    ]);
    clang(&args);
    for _ in 0..5 {
        let out = Command::new("timeout")
            .arg("60")
            .arg(&program)
            .arg(&so)
            .env_remove("OMP_TARGET_OFFLOAD")
            .output()
            .unwrap();
        assert_ne!(out.status.code(), Some(124), "deadlocked: {}", stdout(&out));
        passed(&out, "images");
    }
}

/// OMPT: a tool in the program registers the device-side callbacks with libomp; this library
/// finds that libomp and reports device initialisation, the image load, and each construct
/// with its data operations and submission, under one target id per construct.
#[test]
fn an_ompt_tool_hears_of_devices_constructs_and_data_operations() {
    let lib = library_dir();
    let program = build("ompt_tool", &lib, &[], "ours");
    let out = run(&program, &[]);
    let text = stdout(&out);
    assert!(
        out.status.success(),
        "{text}
{}",
        stderr(&out)
    );
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[..2], ["init 0 host", "load 0 bytes"], "{text}");
    // Each construct: BEGIN, its operations and submissions (same id), END.
    let mut shapes = Vec::new();
    let mut i = 2;
    while i < lines.len() && lines[i].starts_with("target ") {
        let w: Vec<&str> = lines[i].split_whitespace().collect();
        assert_eq!((w[3], w[4], w[5]), ("BEGIN", "0", "code"), "{text}");
        let (id, kind) = (w[1], w[2]);
        let mut shape = vec![format!("kind {kind}")];
        i += 1;
        while !lines[i].starts_with("target ") {
            let w: Vec<&str> = lines[i].split_whitespace().collect();
            assert_eq!(w[1], id, "{text}");
            shape.push(match w[0] {
                "op" => format!("op {} {}", w[2], w[3]),
                _ => format!("submit {}", w[2]),
            });
            i += 1;
        }
        assert_eq!(lines[i], format!("target {id} {kind} END 0 code"), "{text}");
        shapes.push(shape.join(", "));
        i += 1;
    }
    assert_eq!(
        shapes,
        [
            "kind 1, op 1 256, op 2 256, submit 2, op 3 256, op 4 0",
            "kind 2, op 1 256, op 2 256",
            "kind 3, op 3 256, op 4 0",
        ],
        "{text}"
    );
    assert_eq!(lines[i..], ["result 126"], "{text}");
}

/// The runtime's diagnostics work for OpenMP programs: `OFFLOAD_PROFILE` traces registration,
/// the image load, map entries, copies and target regions; `OFFLOAD_INFO` adds the runtime's
/// lines; `LIBOMPTARGET_INFO` gives upstream's lines only (programs compare them line by line).
#[test]
fn offload_diagnostics_trace_openmp_programs() {
    let lib = library_dir();
    let program = build("smoke", &lib, &[], "ours");
    let profile = scratch("omptarget").join("profile.json");
    let out = run(&program, &[("OFFLOAD_PROFILE", profile.to_str().unwrap())]);
    passed(&out, "smoke with a profile");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&profile).unwrap()).unwrap();
    let names: Vec<String> = json["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["name"].as_str().map(String::from))
        .collect();
    for want in [
        "OpenMP descriptor",
        "image load",
        "OpenMP map entry:",
        "omp copy to device",
        "omp copy to host",
        "target region",
        "target data",
        "kernel launch",
    ] {
        assert!(
            names.iter().any(|n| n.starts_with(want)),
            "no {want} in {names:?}"
        );
    }
    let out = run(&program, &[("LIBOMPTARGET_INFO", "-1")]);
    let said = stderr(&out);
    assert!(
        said.contains("omptarget device 0 info: Entering OpenMP kernel"),
        "{said}"
    );
    assert!(!said.contains("offload: info:"), "{said}");
    let out = run(&program, &[("OFFLOAD_INFO", "memory")]);
    let said = stderr(&out);
    assert!(
        said.contains("offload: info: memory: OpenMP map entry: host 0x"),
        "{said}"
    );
}

/// Devices are numbered as upstream numbers them: only a device that can run one of the
/// program's images gets a number. The test backend's device (ELF machine 0x7E57) cannot run
/// x86-64 images, so the program sees the host's four devices; why the others did not take the
/// image is in the info lines (`LIBOMPTARGET_INFO` 0x10) and, when no device is left, in the
/// mandatory policy's failure. Device 4 is then the initial device, 5 is out of range.
#[test]
fn a_device_that_cannot_run_the_image_says_why() {
    let lib = library_dir();
    let program = build("device_pick", &lib, &[], "ours");
    let dir = testdev_plugin_dir();
    let path = [("OFFLOAD_PLUGIN_PATH", dir.to_str().unwrap())];
    let out = Command::new(&program)
        .arg("4")
        .envs(path)
        .env("LIBOMPTARGET_INFO", "16")
        .env_remove("OMP_TARGET_OFFLOAD")
        .output()
        .unwrap();
    assert!(
        out.status.success() && stdout(&out) == "devices 4\ninitial 1\n",
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    let said = stderr(&out);
    assert!(
        said.lines()
            .any(|l| l.contains("not taken by plugin 'testdev'") && l.contains("EM_X86_64")),
        "{said}"
    );
    // The host's devices run it.
    let out = Command::new(&program).arg("2").envs(path).output().unwrap();
    assert!(stdout(&out).contains("initial 0"), "{}", stderr(&out));
    // Out of range: upstream's fatal error.
    let out = Command::new(&program).arg("5").envs(path).output().unwrap();
    assert!(
        !out.status.success()
            && stderr(&out).contains("Device number '5' out of range, only 4 devices available"),
        "{}",
        stderr(&out)
    );
    // No host device and only the test backend's: nothing can run the image; mandatory
    // offloading fails with upstream's messages and says why.
    let out = Command::new(&program)
        .arg("0")
        .envs(path)
        .env("OFFLOAD_OMP_HOST_DEVICES", "0")
        .env("OMP_TARGET_OFFLOAD", "MANDATORY")
        .output()
        .unwrap();
    let said = stderr(&out);
    assert!(
        !out.status.success()
            && stdout(&out).contains("devices 0")
            && said.contains("No images found compatible with the installed hardware.")
            && said.lines().any(
                |l| l.starts_with("omptarget error: Not taken: plugin 'testdev'")
                    && l.contains("EM_X86_64")
            )
            && said.contains(
                "omptarget fatal error 1: failure of target construct while offloading is mandatory"
            ),
        "{said}"
    );
    // With offloading disabled it runs on the host.
    let out = Command::new(&program)
        .arg("4")
        .envs(path)
        .env("OMP_TARGET_OFFLOAD", "DISABLED")
        .output()
        .unwrap();
    assert!(
        out.status.success() && stdout(&out).contains("initial 1"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_program_built_against_debians_library_runs_on_ours() {
    let debian = PathBuf::from("/usr/lib/llvm-19/lib");
    let program = scratch("omptarget").join("smoke-debian-linked");
    let src = repo_root().join("tests/omp/smoke.c");
    clang(&[
        "-fopenmp",
        "-fopenmp-targets=x86_64-pc-linux-gnu",
        "-O1",
        src.to_str().unwrap(),
        "-o",
        program.to_str().unwrap(),
        &format!("-L{}", debian.display()),
    ]);
    let lib = library_dir();
    let out = run(
        &program,
        &[
            ("LD_LIBRARY_PATH", lib.to_str().unwrap()),
            // Ours: Debian's library has no such variable and always offers 4 devices.
            ("OFFLOAD_OMP_HOST_DEVICES", "3"),
        ],
    );
    assert!(passed(&out, "Debian-linked on ours").contains("devices 3"));
}

#[test]
fn the_offload_policy_is_honoured() {
    let lib = library_dir();
    let program = build("smoke", &lib, &[], "policy");
    // DISABLED: every region runs on the host (the program then sees no device copy).
    let out = run(&program, &[("OMP_TARGET_OFFLOAD", "DISABLED")]);
    let text = stdout(&out);
    assert!(text.contains("FAIL offloaded"), "{text}");
    assert!(!stderr(&out).contains("fatal"), "{}", stderr(&out));
    // MANDATORY with no device: upstream's fatal error, and the process aborts.
    let out = run(
        &program,
        &[
            ("OMP_TARGET_OFFLOAD", "MANDATORY"),
            ("OFFLOAD_OMP_HOST_DEVICES", "0"),
        ],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains(
            "omptarget fatal error 1: failure of target construct while offloading is mandatory"
        ),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_device_number_out_of_range_is_upstreams_fatal_error() {
    let program = build_source(
        "bad_device",
        "#include <omp.h>\nint main(void) { int x = 0;\n#pragma omp target device(7) map(tofrom: x)\n x = 1;\n return x; }\n",
        &["-fopenmp", "-fopenmp-targets=x86_64-pc-linux-gnu"],
    );
    let out = run(&program, &[]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("Device number '7' out of range, only 4 devices available"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn malformed_descriptors_are_errors_and_the_program_goes_on() {
    let program = build_source(
        "bad_desc",
        r#"#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
struct entry { void *addr; char *name; size_t size; int32_t flags, data; };
struct image { void *start, *end; struct entry *eb, *ee; };
struct desc { int32_t n; struct image *images; struct entry *hb, *he; };
void __tgt_register_lib(struct desc *);
void __tgt_unregister_lib(struct desc *);
int omp_get_num_devices(void);
int main(void) {
  static unsigned char junk[256];
  for (int i = 0; i < 256; i++) junk[i] = (unsigned char)(i * 37 + 11);
  struct image backwards = { junk + 100, junk, 0, 0 };
  struct image huge = { junk, (void *)~(uintptr_t)0, 0, 0 };
  struct image garbage = { junk, junk + 256, 0, 0 };
  struct desc cases[] = {
    { -1, 0, 0, 0 },
    { 2, 0, 0, 0 },
    { 1, &backwards, 0, 0 },
    { 1, &huge, 0, 0 },
    { 1, &garbage, 0, 0 },
    { 1 << 30, &garbage, 0, 0 },
  };
  __tgt_register_lib(0);
  for (unsigned i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    __tgt_register_lib(&cases[i]);
    printf("case %u: %d devices\n", i, omp_get_num_devices());
  }
  for (unsigned i = 0; i < sizeof cases / sizeof cases[0]; i++) __tgt_unregister_lib(&cases[i]);
  printf("alive\n");
  return 0;
}
"#,
        &["-lomptarget"],
    );
    let out = run(&program, &[]);
    let (text, err) = (stdout(&out), stderr(&out));
    assert!(
        out.status.success() && text.ends_with("alive\n"),
        "{text}\n{err}"
    );
    // Each bad descriptor is one error naming what is wrong; the garbage image registers (it
    // is refused when a device would load it).
    for needle in [
        "the descriptor is NULL",
        "says -1 device images",
        "says 2 device images at 0x0",
        "device image 0 spans",
        "says 1073741824 device images",
    ] {
        assert!(err.contains(needle), "'{needle}' missing from:\n{err}");
    }
}

/// A panic in the library never unwinds into the program's C frames: the entry point returns
/// upstream's failure value with a message naming it, and the program goes on (the debug
/// build's `OFFLOAD_OMP_PANIC_IN` makes the named entry point panic). A target construct that
/// panics is a failed construct: with devices the policy is mandatory, so it ends in upstream's
/// fatal error (never a silent run on the host, nor a second run after a late panic).
#[test]
fn a_panic_in_the_library_is_a_failure_return_not_an_unwind_into_c() {
    let program = build_source(
        "panics",
        r#"#include <omp.h>
#include <stdio.h>
int main(void) {
  int n = omp_get_num_devices();
  void *p = omp_target_alloc(64, 0);
  int x = 0, on_host = -1;
#pragma omp target map(tofrom : x) map(from : on_host)
  { x = 42; on_host = omp_is_initial_device(); }
  printf("devices %d alloc %s x %d host %d\n", n, p ? "ok" : "null", x, on_host);
  if (p) omp_target_free(p, 0);
  return 0;
}
"#,
        &["-fopenmp", "-fopenmp-targets=x86_64-pc-linux-gnu"],
    );
    let baseline = run(&program, &[]);
    assert!(
        stdout(&baseline).contains("devices 4 alloc ok x 42 host 0"),
        "{}{}",
        stdout(&baseline),
        stderr(&baseline)
    );
    let out = run(&program, &[("OFFLOAD_OMP_PANIC_IN", "__tgt_target_kernel")]);
    let err = stderr(&out);
    assert!(!out.status.success(), "{}{err}", stdout(&out));
    assert!(
        err.contains("__tgt_target_kernel: internal error, the call failed")
            && err.contains(
                "omptarget fatal error 1: failure of target construct while offloading is mandatory"
            ),
        "{err}"
    );
    for (entry, want) in [
        ("omp_get_num_devices", "devices 0 alloc ok x 42 host 0"),
        ("omp_target_alloc", "devices 4 alloc null x 42 host 0"),
    ] {
        let out = run(&program, &[("OFFLOAD_OMP_PANIC_IN", entry)]);
        let (text, err) = (stdout(&out), stderr(&out));
        assert!(
            out.status.success() && text.contains(want),
            "{entry}: {text}{err}"
        );
        assert!(
            err.contains(&format!(
                "{entry}: internal error, the call failed (a panic in libomptarget: injected by \
                 OFFLOAD_OMP_PANIC_IN"
            )),
            "{entry}: {err}"
        );
        assert!(
            !err.contains("panicked at"),
            "{entry}: the panic printed: {err}"
        );
    }
}

/// `__tgt_target_nowait_query` is a front door too: libomp passes back the handles this library
/// left in its tasks, and only those are used. A NULL slot, an empty one, and seeded forged
/// handles (small numbers, stack and heap addresses, random words) are each an error that
/// names the handle, the slot is cleared (libomp would re-enqueue a task with a set slot for
/// ever), and the process goes on.
#[test]
fn forged_nowait_handles_are_errors_and_the_program_goes_on() {
    let program = build_source(
        "bad_handle",
        r#"#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
int __tgt_target_nowait_query(void **);
int main(int argc, char **argv) {
  uint64_t s = argc > 1 ? strtoull(argv[1], 0, 0) : 1;
  int failed = 0, calls = 0;
  if (__tgt_target_nowait_query(0) != 0) failed++;
  calls++;
  void *slot = 0;
  if (__tgt_target_nowait_query(&slot) == 0 && slot == 0) printf("empty ok\n");
  int local = 0;
  void *heap = malloc(64);
  for (int i = 0; i < 300; i++) {
    s ^= s << 13; s ^= s >> 7; s ^= s << 17;
    switch (i % 4) {
      case 0: slot = (void *)(uintptr_t)(s % 4096 + 1); break;
      case 1: slot = (char *)&local + (s % 64); break;
      case 2: slot = (char *)heap + (s % 64); break;
      default: slot = (void *)(uintptr_t)(s | 1); break;
    }
    void *was = slot;
    calls++;
    if (__tgt_target_nowait_query(&slot) != 0 && slot == 0 && was != 0) failed++;
  }
  free(heap);
  printf("alive %d of %d refused\n", failed, calls);
  return 0;
}
"#,
        &["-lomptarget"],
    );
    for seed in ["1", "0x9e3779b97f4a7c15", "12345"] {
        let out = Command::new(&program)
            .arg(seed)
            .output()
            .expect("run the program");
        let (text, err) = (stdout(&out), stderr(&out));
        assert!(
            out.status.success()
                && text.contains("empty ok")
                && text.contains("alive 301 of 301 refused"),
            "seed {seed}: {text}\n{err}"
        );
        assert!(err.contains("the async handle slot is NULL"), "{err}");
        assert_eq!(
            err.matches("is not an async handle of this library")
                .count(),
            300,
            "seed {seed}: {err}"
        );
    }
}

/// Seeded mutants of a device image in a registered descriptor: the first target region either
/// runs, or fails the way upstream fails under the (default, mandatory) policy: one
/// `omptarget fatal error 1` and `abort()`. Never another signal, never a hang.
#[test]
fn mutated_device_images_fail_as_upstream_fails_never_worse() {
    use std::os::unix::process::ExitStatusExt;
    let lib = library_dir();
    let dir = scratch("omptarget-mutants");
    let kernel_src = dir.join("k.c");
    std::fs::write(
        &kernel_src,
        "void k(void *launch_env) { (void)launch_env; }\n",
    )
    .unwrap();
    let image = dir.join("k.so");
    clang(&[
        "-O2",
        "-fPIC",
        "-shared",
        kernel_src.to_str().unwrap(),
        "-o",
        image.to_str().unwrap(),
    ]);
    let driver_src = dir.join("driver.c");
    std::fs::write(
        &driver_src,
        r#"#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
struct entry { void *addr; char *name; size_t size; int32_t flags, data; };
struct image { void *start, *end; struct entry *eb, *ee; };
struct desc { int32_t n; struct image *images; struct entry *hb, *he; };
struct kargs { uint32_t version, nargs; void **bases, **ptrs; int64_t *sizes, *types;
               void **names, **mappers; uint64_t tripcount, flags; uint32_t teams[3], threads[3], dyn; };
void __tgt_register_lib(struct desc *);
void __tgt_unregister_lib(struct desc *);
int __tgt_target_kernel(void *, int64_t, int32_t, int32_t, void *, struct kargs *);
static char region;
int main(int argc, char **argv) {
  FILE *f = fopen(argv[1], "rb");
  if (!f) return 3;
  static unsigned char buf[1 << 20];
  size_t len = fread(buf, 1, sizeof buf, f);
  fclose(f);
  struct entry e = { &region, "k", 0, 0, 0 };
  struct image img = { buf, buf + len, &e, &e + 1 };
  struct desc d = { 1, &img, &e, &e + 1 };
  __tgt_register_lib(&d);
  struct kargs ka = { 3, 0 };
  int r = __tgt_target_kernel(NULL, 0, -1, -1, &region, &ka);
  printf("rc %d\n", r);
  __tgt_unregister_lib(&d);
  return 0;
}
"#,
    )
    .unwrap();
    let driver = dir.join("driver");
    clang(&[
        driver_src.to_str().unwrap(),
        "-o",
        driver.to_str().unwrap(),
        &format!("-L{}", lib.display()),
        &format!("-Wl,-rpath,{}", lib.display()),
        "-lomptarget",
    ]);
    let good = std::fs::read(&image).unwrap();
    let run_image = |bytes: &[u8], tag: &str| {
        let p = dir.join(format!("img-{tag}"));
        std::fs::write(&p, bytes).unwrap();
        let mut cmd = Command::new(&driver);
        cmd.arg(&p)
            .env("OFFLOAD_OMP_HOST_DEVICES", "1")
            .env("LIBOMPTARGET_INFO", "16");
        cmd.output().unwrap()
    };
    // The unmutated image runs.
    let out = run_image(&good, "good");
    assert!(
        stdout(&out).contains("rc 0"),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    let mut seq = offload_core::rand::XorShift(0x0ff1_0ad5);
    let mut next = || seq.next_u64();
    let (mut ran, mut refused, mut untaken) = (0, 0, 0);
    for i in 0..40 {
        let mut m = good.clone();
        match next() % 3 {
            0 => {
                for _ in 0..1 + next() % 8 {
                    let at = (next() as usize) % m.len();
                    m[at] ^= 1 << (next() % 8);
                }
            }
            1 => m.truncate(16 + (next() as usize) % (m.len() - 16)),
            _ => {
                let at = (next() as usize) % (m.len() - 64);
                for b in &mut m[at..at + 64] {
                    *b = next() as u8;
                }
            }
        }
        let out = run_image(&m, &i.to_string());
        match (out.status.code(), out.status.signal()) {
            (Some(0), _) if stdout(&out).contains("rc 0") => ran += 1,
            // No plugin's device takes the image, so there is no device and the default
            // policy is "disabled": the construct fails and the program runs its host code,
            // as upstream's does.
            (Some(0), _)
                if stdout(&out).contains("rc -1")
                    && stderr(&out).lines().any(|l| {
                        l.contains("not taken by plugin 'host'")
                            || l.contains("not taken by device host:0")
                    }) =>
            {
                untaken += 1
            }
            (_, Some(libc::SIGABRT))
                if stderr(&out).contains(
                    "omptarget fatal error 1: failure of target construct while offloading is mandatory",
                ) =>
            {
                refused += 1
            }
            other => panic!(
                "mutant {i}: {other:?}\nstdout: {}\nstderr: {}",
                stdout(&out),
                stderr(&out)
            ),
        }
    }
    println!(
        "40 mutants: {ran} ran, {refused} refused with upstream's fatal error, {untaken} taken \
         by no device"
    );
    assert_eq!(ran + refused + untaken, 40);
    assert!(
        refused + untaken > 0,
        "no mutant was refused: the mutations do nothing"
    );
}
