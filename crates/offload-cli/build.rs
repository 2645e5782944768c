//! Compiles the demo kernel (`kernels/saxpy.c`) into a host shared object that `offload demo`
//! embeds. The compiler is `$OFFLOAD_KERNEL_CC`, else the first of clang-19, clang, cc found.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("../..");
    let source = root.join("kernels/saxpy.c");
    let header = root.join("include/offload_kernel.h");
    println!("cargo:rerun-if-changed={}", source.display());
    println!("cargo:rerun-if-changed={}", header.display());
    println!("cargo:rerun-if-env-changed=OFFLOAD_KERNEL_CC");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("demo_saxpy.so");

    let candidates: Vec<String> = match std::env::var("OFFLOAD_KERNEL_CC") {
        Ok(cc) if !cc.is_empty() => vec![cc],
        _ => ["clang-19", "clang", "cc"].map(String::from).to_vec(),
    };
    let mut tried = Vec::new();
    for cc in &candidates {
        let result = Command::new(cc)
            .args([
                "-O2",
                "-fPIC",
                "-shared",
                "-ffp-contract=off",
                "-Wall",
                "-Werror",
            ])
            .arg("-I")
            .arg(root.join("include"))
            .arg(&source)
            .arg("-o")
            .arg(&out)
            .output();
        match result {
            Ok(o) if o.status.success() => {
                println!("cargo:rustc-env=OFFLOAD_DEMO_KERNEL_CC={cc}");
                return;
            }
            Ok(o) => tried.push(format!(
                "{cc}: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            )),
            Err(e) => tried.push(format!("{cc}: {e}")),
        }
    }
    panic!(
        "cannot compile the demo kernel {}: no working C compiler (set OFFLOAD_KERNEL_CC, or run \
         scripts/setup.sh to install clang-19). Tried:\n{}",
        source.display(),
        tried.join("\n")
    );
}
