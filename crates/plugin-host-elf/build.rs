//! Builds the host CPU detection helper (`cpp/host_cpu.cpp`) against LLVM 19's *static*
//! TargetParser and Support archives (found with `llvm-config-19`, or `$LLVM_CONFIG`), so the
//! plugin names the host CPU exactly as LLVM does without linking libLLVM.so.

use std::process::Command;

fn llvm_config(llvm_config: &str, arg: &str) -> String {
    Command::new(llvm_config)
        .arg(arg)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| {
            panic!(
                "`{llvm_config} {arg}` failed: LLVM 19 development files are needed \
                 (run scripts/setup.sh, or apt-get install llvm-19-dev)"
            )
        })
}

fn main() {
    println!("cargo:rerun-if-changed=cpp/host_cpu.cpp");
    println!("cargo:rerun-if-changed=cpp/exec.c");
    println!("cargo:rerun-if-changed=../../include/offload_kernel.h");
    // The fault guard around kernel calls (C: it jumps out of a signal handler, which must not
    // cross Rust frames). It takes the work-item context's type from the kernel header.
    cc::Build::new()
        .file("cpp/exec.c")
        .include("../../include")
        .flag("-std=gnu11")
        .warnings(true)
        .compile("offload_host_exec");
    println!("cargo:rerun-if-env-changed=LLVM_CONFIG");
    let config = std::env::var("LLVM_CONFIG").unwrap_or_else(|_| "llvm-config-19".into());
    let include = llvm_config(&config, "--includedir");
    let libdir = llvm_config(&config, "--libdir");
    cc::Build::new()
        .cpp(true)
        .file("cpp/host_cpu.cpp")
        .include(include)
        .flag("-std=c++17")
        .flag("-fno-exceptions")
        .flag("-fno-rtti")
        .define("_GNU_SOURCE", None)
        .define("__STDC_CONSTANT_MACROS", None)
        .define("__STDC_FORMAT_MACROS", None)
        .define("__STDC_LIMIT_MACROS", None)
        .warnings(false)
        .compile("offload_host_cpu");
    println!("cargo:rustc-link-search=native={libdir}");
    for lib in ["LLVMTargetParser", "LLVMSupport", "LLVMDemangle"] {
        println!("cargo:rustc-link-lib=static={lib}");
    }
}
