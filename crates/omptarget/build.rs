//! Links `libomptarget.so` as LLVM 19's `libomptarget.so.19.1`: its SONAME and its `VERS1.0`
//! version node (`exports.map`). Cargo cannot name a library `libomptarget.so.19.1`, and a build
//! script writes only under its `OUT_DIR`, so the versioned name a program's loader looks for
//! is a symlink that whoever runs programs on it makes beside it (the README's
//! `ln -sf libomptarget.so target/release/libomptarget.so.19.1`; the tests' `omptarget_dir`;
//! `scripts/omp-conformance.sh`).

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rerun-if-changed=exports.map");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libomptarget.so.19.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/exports.map");
}
