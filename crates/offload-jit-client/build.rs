//! Records the version of the LLVM the JIT worker is built against (`llvm-config-19
//! --version`, or `$LLVM_CONFIG`), so that cache keys name it without loading LLVM. The worker
//! reports its own version at start-up and the client refuses a worker built for another.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=LLVM_CONFIG");
    let llvm_config = std::env::var("LLVM_CONFIG").unwrap_or_else(|_| "llvm-config-19".into());
    let version = Command::new(&llvm_config)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| {
            panic!(
                "`{llvm_config} --version` failed: LLVM 19 development files are needed \
                 (run scripts/setup.sh, or apt-get install llvm-19-dev)"
            )
        });
    println!("cargo:rustc-env=OFFLOAD_LLVM_VERSION={version}");
    // Where its shared library is: the disk cache's keys name that file (its size and time).
    let libdir = Command::new(&llvm_config)
        .arg("--libdir")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    println!("cargo:rustc-env=OFFLOAD_LLVM_LIBDIR={libdir}");
}
