//! The examples (`examples/`) run and check their own results; and a crate outside the
//! workspace that depends on `offload` by path builds and runs saxpy with `cargo run` alone:
//! no plugin library, no environment (the host backend linked in, the kernels built by
//! `offload-build` in its build script).

use offload_tests::*;
use std::path::Path;
use std::process::Command;

/// A command with no `OFFLOAD_*` variable and none of the `CARGO_*` ones this test runs with
/// (except `CARGO_HOME`): what a new user's shell has.
fn clean(mut cmd: Command) -> Command {
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().to_string();
        if k.starts_with("OFFLOAD_")
            || (k.starts_with("CARGO_") && k != "CARGO_HOME")
            || k == "RUSTFLAGS"
        {
            cmd.env_remove(k);
        }
    }
    cmd
}

#[test]
fn every_example_runs_and_checks_its_result() {
    for (bin, says) in [
        ("saxpy", "1048576 of 1048576 elements right"),
        ("two_kernels", "right"),
        ("async_overlap", "right"),
        ("bitcode", "right"),
        ("select_device", "ran on host:0: right"),
        ("reduction", "(expected 505929192)"),
    ] {
        let exe = build_dir().join(bin);
        assert!(
            exe.is_file(),
            "{} is not built (cargo build --workspace)",
            exe.display()
        );
        let out = clean(Command::new(&exe)).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains(says),
            "{bin}: {}\n{text}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

#[test]
fn a_fresh_crate_outside_the_workspace_runs_saxpy_with_cargo_run() {
    let root = repo_root().canonicalize().unwrap();
    let dir = scratch("fresh-crate");
    let krate = dir.join("my-gpu-app");
    let _ = std::fs::remove_dir_all(&krate);
    copy_dir(&root.join("examples"), &krate);
    // The manifest a new user writes: their own package, offload by path, nothing inherited
    // from our workspace.
    std::fs::write(
        krate.join("Cargo.toml"),
        format!(
            "[package]\nname = \"my-gpu-app\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n\
             [dependencies]\noffload = {{ path = \"{0}/crates/offload\" }}\n\n\
             [build-dependencies]\noffload-build = {{ path = \"{0}/crates/offload-build\" }}\n\n\
             [workspace]\n",
            root.display()
        ),
    )
    .unwrap();
    // The same dependency versions as the workspace (offline-safe: all already fetched).
    std::fs::copy(root.join("Cargo.lock"), krate.join("Cargo.lock")).unwrap();
    let mut cmd = clean(Command::new("cargo"));
    cmd.current_dir(&krate)
        .args(["run", "--quiet", "--bin", "saxpy"])
        .env("CARGO_TARGET_DIR", dir.join("target"));
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("saxpy on host:0: 1048576 of 1048576 elements right"),
        "cargo run in a fresh crate: {}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // No plugin library was placed anywhere: the host backend is the linked one.
    let target = dir.join("target/debug");
    assert!(!target.join("liboffload_plugin_host.so").exists());
    let _ = std::fs::remove_dir_all(&dir);
}
