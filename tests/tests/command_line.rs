//! The `offload` command's contract: exit status 2 for usage errors, 1 for run-time failures,
//! one clear error line, never a panic backtrace; the demo verifies its result.

use offload_tests::*;

fn assert_one_line_error(out: &std::process::Output, status: i32, needle: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(status), "stderr: {err}");
    assert_eq!(err.lines().count(), 1, "exactly one error line: {err}");
    assert!(err.starts_with("offload: error: "), "{err}");
    assert!(err.contains(needle), "'{err}' should contain '{needle}'");
    assert!(
        !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
        "{err}"
    );
}

#[test]
fn usage_errors_exit_with_status_2() {
    let so = host_kernel("saxpy");
    let so = so.to_str().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["frobnicate"], "frobnicate"),
        (vec!["run", so], "--kernel"),
        (
            vec!["run", so, "--kernel", "saxpy", "--arg", "i8:3"],
            "unknown type 'i8'",
        ),
        (
            vec!["run", so, "--kernel", "saxpy", "--arg", "i32:abc"],
            "'abc' is not a valid i32",
        ),
        (
            vec!["run", so, "--kernel", "saxpy", "--arg", "buf:f32:0"],
            "not a positive integer",
        ),
        (
            vec!["run", so, "--kernel", "saxpy", "--arg", "buf:f32:4:ones"],
            "unknown buffer initialiser 'ones'",
        ),
        (
            vec!["run", so, "--kernel", "saxpy", "--grid", "0"],
            "'0' is not an integer from 1",
        ),
        (
            vec!["run", so, "--kernel", "saxpy", "--block", "1,2,3,4"],
            "is not X[,Y[,Z]]",
        ),
        (
            vec!["run", so, "--kernel", "saxpy", "--device", "host"],
            "is not PLUGIN:INDEX",
        ),
        (
            vec!["run", "/nonexistent/k.so", "--kernel", "saxpy"],
            "cannot read image '/nonexistent/k.so'",
        ),
        (
            vec![
                "run",
                so,
                "--kernel",
                "saxpy",
                "--arg",
                "buf:f32:4:file=/nonexistent/x.bin",
            ],
            "cannot read --arg 0 file= '/nonexistent/x.bin': No such file",
        ),
    ];
    for (args, needle) in cases {
        let out = offload(&args, &[]);
        assert_one_line_error(&out, 2, needle);
    }
    // A file of the wrong size for file=PATH.
    let dir = scratch("cli-usage");
    let f = dir.join("three floats.bin");
    std::fs::write(&f, [0u8; 12]).unwrap();
    let spec = format!("buf:f32:4:file={}", f.display());
    let out = offload(&["run", so, "--kernel", "saxpy", "--arg", &spec], &[]);
    assert_one_line_error(&out, 2, "has 12 bytes, expected exactly 16 (4 x f32)");
}

#[test]
fn runtime_failures_exit_with_status_1() {
    let so = host_kernel("saxpy");
    let so = so.to_str().unwrap();
    let out = offload(&["run", so, "--kernel", "sapxy"], &[]);
    assert_one_line_error(
        &out,
        1,
        "kernel 'sapxy' is not exported by the image; exported functions: saxpy",
    );
    let out = offload(&["run", so, "--kernel", "saxpy", "--device", "cuda:0"], &[]);
    assert_one_line_error(&out, 1, "plugin 'cuda'");
    let saxpy_args = [
        "--arg",
        "i32:16",
        "--arg",
        "f32:2",
        "--arg",
        "buf:f32:16",
        "--arg",
        "buf:f32:16",
    ];
    let with = |extra: &[&'static str], args: &[&'static str]| {
        let mut v = vec!["run", so, "--kernel", "saxpy"];
        v.extend_from_slice(extra);
        v.extend_from_slice(args);
        offload(&v, &[])
    };
    let out = with(&["--block", "2048"], &saxpy_args);
    assert_one_line_error(
        &out,
        1,
        "block dimension x is 2048; the device allows at most 1024",
    );
    // saxpy has an OFFLOAD_PARAMS record: the command checks the arguments against it, so
    // n = 256 with 16-float buffers is refused instead of writing past them.
    let out = with(
        &["--grid", "1", "--block", "256"],
        &[
            "--arg",
            "i32:256",
            "--arg",
            "f32:2",
            "--arg",
            "buf:f32:16",
            "--arg",
            "buf:f32:16",
        ],
    );
    assert_one_line_error(
        &out,
        1,
        "kernel 'saxpy' (its OFFLOAD_PARAMS record): parameter 2 'x' (const float x[n]) may touch 256 element(s) ([n], 1024 bytes); --arg 3 holds 64 bytes",
    );
    // Lengths in bytes: 8 doubles hold 16 floats (the types are the plugin's to check).
    let out = with(
        &["--grid", "1", "--block", "16"],
        &[
            "--arg",
            "i32:16",
            "--arg",
            "f32:2",
            "--arg",
            "buf:f64:8",
            "--arg",
            "buf:f32:16",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let out = with(
        &[],
        &[
            "--arg",
            "i32:-3",
            "--arg",
            "f32:2",
            "--arg",
            "buf:f32:16",
            "--arg",
            "buf:f32:16",
        ],
    );
    assert_one_line_error(&out, 1, "a negative extent is refused");
    // A correct launch runs.
    let out = with(&["--grid", "1", "--block", "16"], &saxpy_args);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = offload(&["info"], &[("OFFLOAD_HOST_THREADS", "lots")]);
    assert!(
        stdout(&out).contains("OFFLOAD_HOST_THREADS='lots' is not valid"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn help_and_version_succeed() {
    let out = offload(&["--help"], &[]);
    assert!(out.status.success());
    for cmd in ["info", "run", "demo"] {
        assert!(stdout(&out).contains(cmd));
    }
    let out = offload(&["run", "--help"], &[]);
    assert!(stdout(&out).contains("buf:TYPE:LEN[:INIT]"));
    assert!(offload(&["--version"], &[]).status.success());
}

#[test]
fn demo_verifies_its_result() {
    let out = offload(&["demo"], &[]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("1000003 of 1000003 elements equal the CPU reference"),
        "{text}"
    );
    assert!(text.contains("result: PASS"), "{text}");
    for step in [
        "discover", "load", "copy-in", "launch", "copy-out", "verify",
    ] {
        assert!(text.contains(step), "demo output lacks step {step}: {text}");
    }
    let out = offload(&["demo", "--n", "1"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
}
