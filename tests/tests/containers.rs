//! Containers made by LLVM's own tools (`clang-offload-packager-19`, `clang-offload-bundler`):
//! the device gets the native image for its exact CPU when there is one, then a compatible one,
//! then bitcode; a container with nothing for any device is an error that lists what it held.

use offload_tests::*;
use std::path::{Path, PathBuf};
use std::process::Command;

fn host_cpu() -> String {
    let out = offload(&["info", "--json"], &[]);
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    plugin_json(&json, "host")["devices"][0]["compute_unit"]
        .as_str()
        .unwrap()
        .to_string()
}

/// A CPU name LLVM knows that is not this host's.
fn other_cpu(host: &str) -> &'static str {
    if host == "znver1" {
        "skylake"
    } else {
        "znver1"
    }
}

fn run_tool(tool: &str, args: &[String]) {
    let out = Command::new(tool)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{tool}: {e} (run scripts/setup.sh)"));
    assert!(
        out.status.success(),
        "{tool} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `clang-offload-packager-19 -o OUT --image=file=F,triple=T,arch=A,kind=openmp ...`
fn package(out: &Path, images: &[(&Path, &str, &str)]) {
    let mut args = vec!["-o".to_string(), out.display().to_string()];
    for (file, triple, arch) in images {
        args.push(format!(
            "--image=file={},triple={triple},arch={arch},kind=openmp",
            file.display()
        ));
    }
    run_tool("clang-offload-packager-19", &args);
}

fn bundle(kind: &str, out: &Path, entries: &[(&str, &Path)]) {
    let targets: Vec<&str> = entries.iter().map(|(t, _)| *t).collect();
    let mut args = vec![
        format!("-type={kind}"),
        format!("-targets={}", targets.join(",")),
        format!("-output={}", out.display()),
    ];
    for (_, input) in entries {
        args.push(format!("-input={}", input.display()));
    }
    run_tool("/usr/lib/llvm-19/bin/clang-offload-bundler", &args);
}

/// Runs saxpy from `image` on the host and returns (compiles, the first result values).
fn run_saxpy(image: &Path) -> (u64, serde_json::Value) {
    let out = offload(
        &[
            "run",
            image.to_str().unwrap(),
            "--kernel",
            "saxpy",
            "--block",
            "4",
            "--arg",
            "i32:4",
            "--arg",
            "f32:2",
            "--arg",
            "buf:f32:4:iota",
            "--arg",
            "buf:f32:4:fill=1",
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
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(json["device"], "host:0");
    (
        json["jit"]["compiles"].as_u64().unwrap(),
        json["buffers"][1]["head"].clone(),
    )
}

fn expected() -> serde_json::Value {
    serde_json::json!([1.0, 3.0, 5.0, 7.0])
}

fn dir(tag: &str) -> PathBuf {
    scratch(tag)
}

#[test]
fn offload_binaries_give_the_device_its_exact_cpu_image_then_a_compatible_one_then_bitcode() {
    let d = dir("offload-binary");
    let (so, bc) = (host_kernel("saxpy"), host_bitcode("saxpy"));
    let cpu = host_cpu();
    let triple = "x86_64-unknown-linux-gnu";

    // The exact CPU's native image wins over bitcode (no compile).
    let exact = d.join("exact.bin");
    package(&exact, &[(&bc, triple, "generic"), (&so, triple, &cpu)]);
    assert_eq!(run_saxpy(&exact), (0, expected()));

    // An image for another CPU is passed over for bitcode (one compile).
    let other = d.join("other.bin");
    package(
        &other,
        &[(&so, triple, other_cpu(&cpu)), (&bc, triple, "generic")],
    );
    assert_eq!(run_saxpy(&other), (1, expected()));

    // A generic native image is compatible: preferred to bitcode.
    let generic = d.join("generic.bin");
    package(
        &generic,
        &[(&bc, triple, "generic"), (&so, triple, "x86-64")],
    );
    assert_eq!(run_saxpy(&generic), (0, expected()));

    // The same through the runtime API, from memory.
    let rt = host_runtime();
    let image = std::fs::read(&exact).unwrap();
    let device = rt.route(&image).unwrap();
    let program = offload_tests::load(&device, &image).unwrap();
    program.kernel("saxpy").unwrap();
}

#[test]
fn a_container_with_nothing_for_any_device_lists_what_it_held() {
    let d = dir("foreign-container");
    let amd = kernel_ir(
        "saxpy",
        &["-target", "amdgcn-amd-amdhsa", "-mcpu=gfx90a", "-nogpulib"],
        "bc",
    );
    let ptx = kernel_ir(
        "saxpy",
        &["-target", "nvptx64-nvidia-cuda", "-march=sm_90"],
        "bc",
    );
    let so = host_kernel("saxpy");
    let cpu = host_cpu();
    let foreign = d.join("foreign.bin");
    package(
        &foreign,
        &[
            (&amd, "amdgcn-amd-amdhsa", "gfx90a"),
            (&ptx, "nvptx64-nvidia-cuda", "sm_90"),
            (&so, "x86_64-unknown-linux-gnu", other_cpu(&cpu)),
        ],
    );
    let out = offload(
        &["run", foreign.to_str().unwrap(), "--kernel", "saxpy"],
        &[],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    for needle in [
        "LLVM offload binary with 3 images",
        "amdgcn-amd-amdhsa/gfx90a",
        "nvptx64-nvidia-cuda/sm_90",
        &format!("x86_64-unknown-linux-gnu/{}", other_cpu(&cpu)),
        "for another target",
        &format!("built for CPU '{}'", other_cpu(&cpu)),
    ] {
        assert!(err.contains(needle), "'{err}' should contain '{needle}'");
    }
    // A damaged container is an error naming the field.
    let mut bytes = std::fs::read(&foreign).unwrap();
    bytes[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    let broken = d.join("broken.bin");
    std::fs::write(&broken, &bytes).unwrap();
    let out = offload(&["run", broken.to_str().unwrap(), "--kernel", "saxpy"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("size (offset 8)"), "{}", stderr(&out));
}

#[test]
fn offload_bundles_plain_and_in_elf_sections() {
    let d = dir("bundles");
    let (so, bc) = (host_kernel("saxpy"), host_bitcode("saxpy"));
    let cpu = host_cpu();

    // A bitcode bundle: the device's entry is compiled.
    let bundled_bc = d.join("bundle.bc");
    bundle(
        "bc",
        &bundled_bc,
        &[
            ("host-x86_64-unknown-linux-gnu", &bc),
            ("openmp-x86_64-unknown-linux-gnu", &bc),
        ],
    );
    assert_eq!(run_saxpy(&bundled_bc), (1, expected()));

    // An object bundle: device images in __CLANG_OFFLOAD_BUNDLE__ sections of the host ELF.
    // The section for this CPU holds the native image; the host entry is not device code.
    let bundled_o = d.join("bundle.o");
    bundle(
        "o",
        &bundled_o,
        &[
            ("host-x86_64-unknown-linux-gnu", &host_kernel("empty")),
            (&format!("openmp-x86_64-unknown-linux-gnu-{cpu}"), &so),
            ("openmp-amdgcn-amd-amdhsa--gfx90a", &bc),
        ],
    );
    assert_eq!(run_saxpy(&bundled_o), (0, expected()));
}
