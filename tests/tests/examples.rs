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

/// Every example but `mpi_saxpy`, which needs an MPI job and runs in tests/tests/mpi.rs.
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

#[test]
fn offload_build_packs_every_target_into_one_container_each_device_picks_from() {
    use offload_build::{Build, Target};
    let dir = scratch("offload-build");
    let path = Build::new()
        .file(repo_root().join("examples/kernels/examples.c"))
        .include(repo_root().join("include"))
        .target(Target::Host)
        .target(Target::HostBitcode)
        .target(Target::Nvptx("sm_90".into()))
        .target(Target::Amdgcn("gfx90a".into()))
        .compile_to(&dir, "all")
        .unwrap_or_else(|e| panic!("{e}"));
    let bytes = std::fs::read(&path).unwrap();
    let c = offload_core::image::container::parse(&bytes)
        .unwrap()
        .unwrap();
    let labels: Vec<String> = c.entries.iter().map(|e| e.label()).collect();
    assert_eq!(labels.len(), 4, "{labels:?}");
    assert!(
        labels[0].starts_with("x86_64") || labels[0].starts_with("aarch64"),
        "{labels:?}"
    );
    assert_eq!(labels[2], "nvptx64-nvidia-cuda/sm_90");
    assert_eq!(labels[3], "amdgcn-amd-amdhsa/gfx90a");
    // Each entry is what its target needs: a host shared object, bitcode, PTX, a code object.
    use offload_core::ImageKind;
    let kinds: Vec<ImageKind> = c
        .entries
        .iter()
        .map(|e| offload_core::classify(e.bytes).unwrap())
        .collect();
    assert!(matches!(kinds[0], ImageKind::Elf(_)), "{:?}", kinds[0]);
    assert!(kinds[1].is_jit_input(), "{:?}", kinds[1]);
    assert!(matches!(kinds[2], ImageKind::Ptx), "{:?}", kinds[2]);
    assert!(
        matches!(kinds[3], ImageKind::Elf(ref i) if i.machine == offload_core::image::machine::AMDGPU),
        "{:?}",
        kinds[3]
    );
    // The host device picks its shared object (the parameter records come along) and runs it.
    let rt = host_runtime();
    let device = rt.device("host", 0).unwrap();
    let program = offload_tests::load(&device, &bytes).unwrap();
    let mut x = device.upload(&[4.0f32; 8]).unwrap();
    program
        .kernel("scale")
        .unwrap()
        .launch(offload::LaunchDims::linear(1, 8))
        .arg(8i32)
        .arg(0.25f32)
        .arg(&mut x)
        .run()
        .unwrap();
    assert_eq!(x.to_vec().unwrap(), vec![1.0f32; 8]);
    // Errors name the problem: a missing source, a failing compile with its diagnostics.
    let e = Build::new()
        .file(dir.join("nope.c"))
        .include(repo_root().join("include"))
        .compile_to(&dir, "x")
        .unwrap_err()
        .to_string();
    assert!(e.contains("nope.c does not exist"), "{e}");
    std::fs::write(
        dir.join("bad.c"),
        "#include \"offload_kernel.h\"\nOFFLOAD_KERNEL void k(int n) { oops; }\n",
    )
    .unwrap();
    let e = Build::new()
        .file(dir.join("bad.c"))
        .include(repo_root().join("include"))
        .compile_to(&dir, "bad")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("compiling kernels 'bad' for the host (shared object) failed")
            && e.contains("oops"),
        "{e}"
    );
}
