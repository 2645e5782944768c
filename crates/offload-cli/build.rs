//! Compiles the demo kernel (`kernels/saxpy.c`) for the host with offload-build, into the
//! container that `offload demo` embeds. The compiler is offload-build's choice:
//! `$OFFLOAD_KERNEL_CC`, else the first of clang-19, clang, cc found.

use std::path::PathBuf;

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("../..");
    let build = offload_build::Build::new()
        .file(root.join("kernels/saxpy.c"))
        .flag("-Wall")
        .flag("-Werror");
    let cc = build.compiler_to_use().unwrap_or_else(|e| {
        panic!("cannot compile the demo kernel: {e} (or run scripts/setup.sh to install clang-19)")
    });
    build
        .compile("demo_saxpy")
        .unwrap_or_else(|e| panic!("cannot compile the demo kernel: {e}"));
    println!("cargo:rustc-env=OFFLOAD_DEMO_KERNEL_CC={cc}");
}
