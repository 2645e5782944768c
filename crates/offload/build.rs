//! Tells the build scripts of crates that depend on `offload` where the kernel header is:
//! `DEP_OFFLOAD_INCLUDE` (what `offload-build` compiles kernels with). Builds nothing.

use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let include = manifest.join("../../include");
    let header = include.join("offload_kernel.h");
    if !header.is_file() {
        panic!(
            "the kernel header {} is missing: the offload crate is built from its repository",
            header.display()
        );
    }
    let include = include.canonicalize().unwrap_or(include);
    println!("cargo:include={}", include.display());
    println!("cargo:rerun-if-changed=build.rs");
}
