//! Hostile and careless input, one test per class: native images that lie about the kernel
//! header's context variable or are damaged where the dynamic loader trusts them, files that are
//! not regular files, launches that do not match a kernel's signature, huge buffers, output that
//! cannot be written, the bare command, runaway kernels and signals, plugins that lie (device
//! counts, names, strings) or panic, untrusted plugin directories, and environment variables
//! that are not what they should be. Every case ends with exit status 1 or 2 and one
//! `offload: error:` line (or the documented behaviour), never a signal, panic text or hang.

use offload_tests::*;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs `offload` with a time limit; a hang fails the test.
fn offload_within(args: &[&str], envs: &[(&str, &str)], limit: Duration) -> Output {
    let mut cmd = Command::new(offload_bin());
    cmd.args(args)
        .env_remove("OFFLOAD_PLUGIN_PATH")
        .env_remove("OFFLOAD_PLUGINS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            panic!("offload {args:?} hung (more than {limit:?})");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

/// Exit status `code`, one `offload: error:` line containing `needle`, no panic text.
fn assert_one_error(out: &Output, code: i32, needle: &str) {
    let err = stderr(out);
    assert_eq!(
        out.status.code(),
        Some(code),
        "status {:?}: {err}",
        out.status
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("offload: error: "), "{err}");
    assert!(err.contains(needle), "'{err}' should contain '{needle}'");
    assert!(
        !err.contains("panicked at") && !err.contains("RUST_BACKTRACE"),
        "{err}"
    );
}

fn so_from(tag: &str, source: &str) -> PathBuf {
    let dir = scratch("hostile");
    let c = dir.join(format!("{tag}.c"));
    let so = dir.join(format!("{tag}.so"));
    std::fs::write(&c, source).unwrap();
    let include = repo_root().join("include");
    clang(&[
        "-O2",
        "-fPIC",
        "-shared",
        "-I",
        include.to_str().unwrap(),
        c.to_str().unwrap(),
        "-o",
        so.to_str().unwrap(),
    ]);
    so
}

const SAXPY_ARGS: [&str; 8] = [
    "--arg",
    "i32:4",
    "--arg",
    "f32:2",
    "--arg",
    "buf:f32:4",
    "--arg",
    "buf:f32:4",
];

#[test]
fn an_image_whose_context_variable_is_not_the_headers_pointer_is_refused() {
    for (tag, src, want) in [
        (
            "ctx-function",
            "void __offload_host_context(void){}\nvoid k(void){}\n",
            "as a function",
        ),
        (
            "ctx-const",
            "const void *const __offload_host_context = 0;\nvoid k(void){}\n",
            "read-only segment",
        ),
        (
            "ctx-byte",
            "char __offload_host_context;\nvoid k(void){}\n",
            "a 1-byte object",
        ),
        (
            "ctx-int",
            "int __offload_host_context;\nvoid k(void){}\n",
            "a 4-byte object",
        ),
    ] {
        let so = so_from(tag, src);
        let out = offload_within(
            &["run", so.to_str().unwrap(), "--kernel", "k"],
            &[],
            Duration::from_secs(20),
        );
        assert_one_error(&out, 1, want);
        assert!(stderr(&out).contains("__offload_host_context"), "{tag}");
    }
}

/// The ranges of a shared object the dynamic loader reads: the ELF header, the program
/// headers, and the dynamic section and the tables it points to (from the section headers).
fn dynamic_structures(so: &[u8]) -> Vec<(usize, usize)> {
    let u16_at = |at: usize| u16::from_le_bytes(so[at..at + 2].try_into().unwrap()) as usize;
    let u32_at = |at: usize| u32::from_le_bytes(so[at..at + 4].try_into().unwrap());
    let u64_at = |at: usize| u64::from_le_bytes(so[at..at + 8].try_into().unwrap()) as usize;
    let (phoff, phnum) = (u64_at(32), u16_at(56));
    let mut ranges = vec![(0, 64), (phoff, phoff + 56 * phnum)];
    let (shoff, shnum) = (u64_at(40), u16_at(60));
    for i in 0..shnum {
        let at = shoff + 64 * i;
        let kind = u32_at(at + 4);
        // DYNAMIC, DYNSYM, STRTAB, RELA, HASH, GNU_HASH, VERSYM, VERNEED, VERDEF, INIT/FINI_ARRAY
        if matches!(
            kind,
            6 | 11 | 3 | 4 | 5 | 0x6fff_fff6 | 0x6fff_ffff | 0x6fff_fffe | 0x6fff_fffd | 14 | 15
        ) {
            let (off, size) = (u64_at(at + 24), u64_at(at + 32));
            if off > 0 && size > 0 && off + size <= so.len() {
                ranges.push((off, off + size));
            }
        }
    }
    ranges
}

#[test]
fn hundreds_of_mutants_of_the_dynamic_linking_structures_never_raise_a_signal() {
    let so = host_kernel("saxpy");
    let original = std::fs::read(&so).unwrap();
    let ranges = dynamic_structures(&original);
    assert!(ranges.len() >= 8, "{ranges:?}");
    let dir = scratch("hostile-mutants");
    let noise = random_bytes(8 * 400, 0xd1a);
    let (mut ok, mut refused) = (0, 0);
    for i in 0..400usize {
        let r = &noise[8 * i..8 * i + 8];
        let (lo, hi) = ranges[usize::from(r[0]) % ranges.len()];
        let mut m = original.clone();
        for k in 0..=usize::from(r[1] % 3) {
            let at = lo + (usize::from(r[2 + k]) << 8 | usize::from(r[5 + k % 3])) % (hi - lo);
            m[at] = match r[7] % 4 {
                0 => m[at] ^ (1 << (r[2 + k] % 8)),
                1 => r[5 + k % 3],
                2 => 0,
                _ => 0xff,
            };
        }
        let path = dir.join(format!("m{i}.so"));
        std::fs::write(&path, &m).unwrap();
        let mut args = vec!["run", path.to_str().unwrap(), "--kernel", "saxpy"];
        args.extend(SAXPY_ARGS);
        let out = offload_within(&args, &[], Duration::from_secs(30));
        let err = stderr(&out);
        match out.status.code() {
            Some(0) => ok += 1,
            Some(1 | 2) => {
                assert_eq!(err.lines().count(), 1, "mutant {i}: {err}");
                assert!(
                    err.starts_with("offload: error: ") && !err.contains("panicked at"),
                    "mutant {i}: {err}"
                );
                refused += 1;
            }
            _ => panic!("mutant {i} ({}): {:?}: {err}", path.display(), out.status),
        }
        let _ = std::fs::remove_file(&path);
    }
    println!("{ok} ran, {refused} refused");
    assert!(refused > 100, "{ok} ran, {refused} refused");
}

#[test]
fn fifos_directories_and_devices_are_refused_without_blocking() {
    let dir = scratch("hostile-files");
    let fifo = dir.join("image.fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let limit = Duration::from_secs(20);
    for (image, want) in [(&fifo, "is a FIFO"), (&dir, "is a directory")] {
        let out = offload_within(
            &["run", image.to_str().unwrap(), "--kernel", "k"],
            &[],
            limit,
        );
        assert_one_error(&out, 2, want);
        let out = offload_within(
            &[
                "jit",
                image.to_str().unwrap(),
                "--target",
                "x86_64-unknown-linux-gnu",
                "--cpu",
                "x86-64",
                "-o",
                "/dev/null",
            ],
            &[],
            limit,
        );
        assert_one_error(&out, 2, want);
    }
    let so = host_kernel("saxpy");
    for (file, want) in [
        (fifo.to_str().unwrap(), "is a FIFO"),
        ("/dev/zero", "is a character device"),
        (dir.to_str().unwrap(), "is a directory"),
    ] {
        let spec = format!("buf:f32:4:file={file}");
        let out = offload_within(
            &[
                "run",
                so.to_str().unwrap(),
                "--kernel",
                "saxpy",
                "--arg",
                "i32:4",
                "--arg",
                "f32:2",
                "--arg",
                &spec,
                "--arg",
                "buf:f32:4",
            ],
            &[],
            limit,
        );
        assert_one_error(&out, 2, want);
    }
    // A FIFO named like a plugin: every command still works, and info says what it is.
    let plugins = scratch("hostile-fifo-plugin");
    let fake = plugins.join("liboffload_plugin_fifo.so");
    let c = std::ffi::CString::new(fake.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let env = [("OFFLOAD_PLUGIN_PATH", plugins.to_str().unwrap())];
    let out = offload_within(&["info", "--json"], &env, limit);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let p = plugin_json(&json, "fifo");
    assert_eq!(p["status"], "failed");
    assert!(
        p["reason"]
            .as_str()
            .unwrap()
            .contains("is a FIFO, not a regular file"),
        "{p}"
    );
    let mut args = vec!["run", so.to_str().unwrap(), "--kernel", "saxpy"];
    args.extend(SAXPY_ARGS);
    assert!(offload_within(&args, &env, limit).status.success());
}

#[test]
fn launches_are_checked_against_a_native_kernels_recorded_signature() {
    let so = host_kernel("saxpy");
    let p = so.to_str().unwrap();
    for (args, want) in [
        (
            vec!["i32:4", "f32:2", "u64:7", "buf:f32:4"],
            "argument 2 is ptr in the kernel; the launch passes u64",
        ),
        (
            vec!["i32:4", "f64:2", "buf:f32:4", "buf:f32:4"],
            "argument 1 is float in the kernel; the launch passes f64",
        ),
        (
            vec!["i32:4", "f32:2", "buf:f32:4"],
            "takes 4 argument(s) (i32, float, ptr, ptr); the launch passes 3",
        ),
    ] {
        let mut a = vec!["run", p, "--kernel", "saxpy"];
        for s in &args {
            a.extend(["--arg", s]);
        }
        assert_one_error(&offload_within(&a, &[], Duration::from_secs(20)), 1, want);
    }
    // Without OFFLOAD_SIGNATURE a launch is not checked (documented): it runs.
    let unsigned = so_from(
        "unsigned",
        "#include \"offload_kernel.h\"\nOFFLOAD_KERNEL void k(int *out) { out[0] = 7; }\n",
    );
    let out = offload_within(
        &[
            "run",
            unsigned.to_str().unwrap(),
            "--kernel",
            "k",
            "--arg",
            "buf:i32:1",
        ],
        &[],
        Duration::from_secs(20),
    );
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn huge_buffers_and_sizes_are_out_of_memory_errors_not_aborts() {
    let so = host_kernel("saxpy");
    let p = so.to_str().unwrap();
    for spec in [
        "buf:f32:1099511627776",
        "buf:i64:1152921504606846976",
        "buf:f64:2305843009213693952",
    ] {
        let out = offload_within(
            &[
                "run",
                p,
                "--kernel",
                "saxpy",
                "--arg",
                "i32:1",
                "--arg",
                "f32:1",
                "--arg",
                spec,
                "--arg",
                "buf:f32:1",
            ],
            &[],
            Duration::from_secs(30),
        );
        let err = stderr(&out);
        assert!(
            matches!(out.status.code(), Some(1 | 2)),
            "{spec}: {:?} {err}",
            out.status
        );
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains("out of memory") || err.contains("too large"),
            "{spec}: {err}"
        );
    }
    assert_one_error(
        &offload_within(&["demo", "--n", "4294967295"], &[], Duration::from_secs(30)),
        1,
        "out of memory: --n 4294967295 needs",
    );
}

#[test]
fn output_that_cannot_be_written_is_one_error_line() {
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let run = |args: &[&str], stdout: Stdio| {
        Command::new(offload_bin())
            .args(args)
            .stdout(stdout)
            .stderr(Stdio::piped())
            .output()
            .unwrap()
    };
    for args in [
        &["info"][..],
        &["info", "--json"][..],
        &["demo", "--n", "10"][..],
    ] {
        let out = run(args, Stdio::from(full.try_clone().unwrap()));
        assert_one_error(
            &out,
            1,
            "cannot write to standard output: No space left on device",
        );
    }
    // A reader that went away: quiet, exit 1, no panic.
    let mut child = Command::new(offload_bin())
        .args(["info", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert!(matches!(out.status.code(), Some(0 | 1)), "{:?}", out.status);
    assert!(!stderr(&out).contains("panicked at"), "{}", stderr(&out));
}

#[test]
fn the_bare_command_help_and_usage_errors() {
    let out = offload(&[], &[]);
    assert_one_error(
        &out,
        2,
        "a command is needed: info, run, jit, cache or demo (see 'offload --help')",
    );
    for args in [&["--help"][..], &["help"][..]] {
        let out = offload(args, &[]);
        assert_eq!(out.status.code(), Some(0));
        assert!(
            stdout(&out).contains("Usage:") && stderr(&out).is_empty(),
            "{args:?}"
        );
    }
    assert_one_error(&offload(&["nosuch"], &[]), 2, "(see 'offload --help')");
    assert_one_error(
        &offload(&["run", "x", "--kernel", "k", "--timeout", "0"], &[]),
        2,
        "greater than 0",
    );
}

#[test]
fn a_runaway_kernel_is_stopped_by_timeout_and_signals_end_offload_cleanly() {
    let spin = so_from(
        "spin",
        "#include \"offload_kernel.h\"\nOFFLOAD_KERNEL void spin(volatile int *flag) { while (!*flag) {} }\nOFFLOAD_SIGNATURE(spin, volatile int *);\n",
    );
    let out = offload_within(
        &[
            "run",
            spin.to_str().unwrap(),
            "--kernel",
            "spin",
            "--arg",
            "buf:i32:1",
            "--timeout",
            "1",
        ],
        &[],
        Duration::from_secs(20),
    );
    assert_one_error(
        &out,
        1,
        "launch of 'spin' (grid 1x1x1, block 1x1x1) on host:0 did not finish within 1 s (--timeout); stopped",
    );
    // SIGINT and SIGTERM: one line, 128 + the signal, and the processes the command started
    // (the JIT worker, for bitcode) end with it.
    let dir = scratch("hostile-spin-bc");
    let src = dir.join("spin.c");
    std::fs::write(
        &src,
        "#include \"offload_kernel.h\"\n#include <unistd.h>\n\
         OFFLOAD_KERNEL void spin(volatile int *flag) {\n\
           write(2, \"spinning\\n\", 9);\n  while (!*flag) {}\n}\n",
    )
    .unwrap();
    let bc = dir.join("spin.bc");
    let include = repo_root().join("include");
    clang(&[
        "-O2",
        "-fPIC",
        "-emit-llvm",
        "-c",
        "-I",
        include.to_str().unwrap(),
        src.to_str().unwrap(),
        "-o",
        bc.to_str().unwrap(),
    ]);
    for (sig, code, word) in [
        (libc::SIGINT, 130, "interrupted (SIGINT)"),
        (libc::SIGTERM, 143, "terminated (SIGTERM)"),
    ] {
        // The kernel says when it runs, and the signal is sent then (the JIT worker has
        // compiled it by then, and is still alive).
        let mut child = Command::new(offload_bin())
            .args([
                "run",
                bc.to_str().unwrap(),
                "--kernel",
                "spin",
                "--arg",
                "buf:i32:1",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let (launched, launch) = std::sync::mpsc::channel();
        let stderr_pipe = child.stderr.take().unwrap();
        let reader = std::thread::spawn(move || {
            use std::io::BufRead;
            let mut all = String::new();
            for line in std::io::BufReader::new(stderr_pipe).lines() {
                let Ok(line) = line else { break };
                if line == "spinning" {
                    let _ = launched.send(());
                }
                all.push_str(&line);
                all.push('\n');
            }
            all
        });
        let started = launch.recv_timeout(Duration::from_secs(120));
        let children = |pid: i32| -> Vec<i32> {
            std::fs::read_dir("/proc")
                .unwrap()
                .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
                .filter(|p| {
                    std::fs::read_to_string(format!("/proc/{p}/stat"))
                        .ok()
                        .and_then(|s| s.rsplit(')').next().map(str::to_string))
                        .and_then(|rest| rest.split_whitespace().nth(1)?.parse::<i32>().ok())
                        == Some(pid)
                })
                .collect()
        };
        let kids = children(pid);
        if started.is_err() {
            let _ = child.kill();
            panic!("the kernel did not start: {}", reader.join().unwrap());
        }
        assert!(!kids.is_empty(), "the JIT worker is not running");
        // SAFETY: signalling our own child.
        unsafe { libc::kill(pid, sig) };
        let status = child.wait().unwrap();
        let err = reader.join().unwrap();
        assert_eq!(status.code(), Some(code), "{err}");
        assert_eq!(
            err.trim().lines().last(),
            Some(format!("offload: {word}").as_str()),
            "{err}"
        );
        assert_eq!(
            err.lines().count(),
            2,
            "the kernel's line and one error: {err}"
        );
        // Its children end with it (PDEATHSIG), within moments.
        let gone = (0..200).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            kids.iter().all(|k| {
                !Path::new(&format!("/proc/{k}")).exists()
                    || std::fs::read_to_string(format!("/proc/{k}/stat"))
                        .is_ok_and(|s| s.contains(") Z "))
            })
        });
        assert!(gone, "children {kids:?} outlived offload");
    }
}

#[test]
fn plugins_that_lie_are_bounded_named_and_escaped() {
    let testdev = testdev_plugin_dir();
    let env = |mode: &'static str| {
        vec![
            ("OFFLOAD_PLUGIN_PATH", testdev.to_str().unwrap().to_string()),
            ("OFFLOAD_TESTDEV_MODE", mode.to_string()),
        ]
    };
    let run = |envs: &[(&str, String)], args: &[&str]| {
        let e: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        offload_within(args, &e, Duration::from_secs(20))
    };
    // A device count no machine has.
    let out = run(&env("many-devices"), &["info", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let t = plugin_json(&json, "testdev");
    assert_eq!(t["status"], "failed");
    assert!(
        t["reason"]
            .as_str()
            .unwrap()
            .contains("reports 4294967295 devices; at most 4096 are believed"),
        "{t}"
    );
    // Strings that try to forge lines are printed escaped.
    let out = run(&env("odd-strings"), &["info"]);
    let text = stdout(&out);
    assert!(
        !text.lines().any(|l| l.starts_with("note: forged")),
        "{text}"
    );
    assert!(
        text.contains("testdev 0\\nnote: forged line\\u{1b}[2J"),
        "{text}"
    );
    // A constructor that panics: its message in the reason, nothing on stderr.
    let out = run(&env("panic-entry"), &["info", "--json"]);
    assert!(out.status.success());
    assert!(stderr(&out).is_empty(), "{}", stderr(&out));
    assert!(stdout(&out).contains("the plugin's constructor panicked: testdev constructor panics"));
    // A panic inside a call: one line, the message in it.
    let image = synthetic_elf(0x7E57, &["panic"]);
    let path = scratch("hostile-panic").join("panic.so");
    std::fs::write(&path, image).unwrap();
    let out = run(
        &env(""),
        &[
            "run",
            path.to_str().unwrap(),
            "--kernel",
            "panic",
            "--device",
            "testdev:0",
        ],
    );
    assert_one_error(&out, 1, "panicked");
    // An impostor: a plugin file that calls itself something else is refused, and the real
    // plugin of that name stays usable.
    let dir = scratch("hostile-impostor");
    std::fs::copy(
        testdev.join("liboffload_plugin_testdev.so"),
        dir.join("liboffload_plugin_evil.so"),
    )
    .unwrap();
    let envs = [("OFFLOAD_PLUGIN_PATH", dir.to_str().unwrap())];
    let out = offload_within(&["info", "--json"], &envs, Duration::from_secs(20));
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let evil = plugin_json(&json, "evil");
    assert_eq!(evil["status"], "failed");
    assert!(
        evil["reason"]
            .as_str()
            .unwrap()
            .contains("calls itself 'testdev', but its file name says 'evil'"),
        "{evil}"
    );
    assert_eq!(plugin_json(&json, "host")["status"], "ok");
    // The same plugin twice: the first is used, the second reported.
    let twice = format!(
        "{}:{}",
        testdev.display(),
        testdev
            .display()
            .to_string()
            .replace("testdev-plugin", "testdev-plugin-copy")
    );
    let copy = PathBuf::from(
        testdev
            .display()
            .to_string()
            .replace("testdev-plugin", "testdev-plugin-copy"),
    );
    std::fs::create_dir_all(&copy).unwrap();
    std::fs::copy(
        testdev.join("liboffload_plugin_testdev.so"),
        copy.join("liboffload_plugin_testdev.so"),
    )
    .unwrap();
    let out = offload_within(
        &["info", "--json"],
        &[("OFFLOAD_PLUGIN_PATH", &twice)],
        Duration::from_secs(20),
    );
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert!(json["notes"].to_string().contains("is not used"), "{json}");
}

#[test]
fn plugins_in_directories_others_can_write_are_refused_unless_trusted() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("hostile-untrusted");
    std::fs::copy(
        testdev_plugin_dir().join("liboffload_plugin_testdev.so"),
        dir.join("liboffload_plugin_testdev.so"),
    )
    .unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let path = [("OFFLOAD_PLUGIN_PATH", dir.to_str().unwrap())];
    let out = offload_within(&["info", "--json"], &path, Duration::from_secs(20));
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let t = plugin_json(&json, "testdev");
    assert_eq!(t["status"], "failed", "{t}");
    let reason = t["reason"].as_str().unwrap();
    assert!(
        reason.contains("is writable by users other than its owner (mode 777)")
            && reason.contains("OFFLOAD_TRUST_PLUGIN_DIRS=1"),
        "{reason}"
    );
    let trusted = [
        ("OFFLOAD_PLUGIN_PATH", dir.to_str().unwrap()),
        ("OFFLOAD_TRUST_PLUGIN_DIRS", "1"),
    ];
    let out = offload_within(&["info", "--json"], &trusted, Duration::from_secs(20));
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(plugin_json(&json, "testdev")["status"], "ok");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    // A plugin file others can write, in a good directory.
    std::fs::set_permissions(
        dir.join("liboffload_plugin_testdev.so"),
        std::fs::Permissions::from_mode(0o666),
    )
    .unwrap();
    let out = offload_within(&["info", "--json"], &path, Duration::from_secs(20));
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert!(
        plugin_json(&json, "testdev")["reason"]
            .as_str()
            .unwrap()
            .contains("plugin file"),
        "{json}"
    );
    // Relative entries depend on the working directory: refused.
    assert_one_error(
        &offload(&["info"], &[("OFFLOAD_PLUGIN_PATH", "plugins")]),
        2,
        "OFFLOAD_PLUGIN_PATH='plugins': entry 'plugins' is a relative path",
    );
}

#[test]
fn bad_environment_values_are_errors_naming_the_variable() {
    let invalid = std::ffi::OsStr::from_bytes(b"/tmp/\xff\xfe");
    for var in ["OFFLOAD_PLUGIN_PATH", "OFFLOAD_PLUGINS"] {
        let out = Command::new(offload_bin())
            .arg("info")
            .env(var, invalid)
            .output()
            .unwrap();
        assert_one_error(&out, 2, &format!("environment variable {var}="));
        assert!(
            stderr(&out).contains("is not valid Unicode"),
            "{}",
            stderr(&out)
        );
    }
    assert_one_error(
        &offload(&["info"], &[("OFFLOAD_PLUGINS", "nosuch")]),
        2,
        "OFFLOAD_PLUGINS='nosuch' names plugin 'nosuch'",
    );
}
