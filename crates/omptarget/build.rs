//! Links `libomptarget.so` as LLVM 19's `libomptarget.so.19.1`: its SONAME and its `VERS1.0`
//! version node (`exports.map`), and puts the versioned name beside it in the target directory
//! (a relative symlink), so `-L target/release -lomptarget` links a program and
//! `LD_LIBRARY_PATH=target/release` runs it.

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rerun-if-changed=exports.map");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libomptarget.so.19.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/exports.map");
    // OUT_DIR is target/<profile>/build/omptarget-<hash>/out.
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    if let Some(profile_dir) = out.ancestors().nth(3) {
        let link = profile_dir.join("libomptarget.so.19.1");
        if std::fs::symlink_metadata(&link).is_err() {
            let _ = std::os::unix::fs::symlink("libomptarget.so", &link);
        }
    }
}
