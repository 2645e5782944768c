//! Compiles the small C++ helper (`cpp/target_info.cpp`) against LLVM 19's headers, found with
//! `llvm-config-19` (or `$LLVM_CONFIG`).

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=cpp/target_info.cpp");
    println!("cargo:rerun-if-changed=cpp/work_groups.cpp");
    println!("cargo:rerun-if-changed=cpp/item_bounds.cpp");
    println!("cargo:rerun-if-changed=cpp/item_bounds.h");
    println!("cargo:rerun-if-changed=cpp/split_codegen.cpp");
    println!("cargo:rerun-if-env-changed=LLVM_CONFIG");
    let llvm_config = std::env::var("LLVM_CONFIG").unwrap_or_else(|_| "llvm-config-19".into());
    let include = Command::new(&llvm_config)
        .arg("--includedir")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| {
            panic!(
                "`{llvm_config} --includedir` failed: LLVM 19 development files are needed \
                 (run scripts/setup.sh, or apt-get install llvm-19-dev)"
            )
        });
    cc::Build::new()
        .cpp(true)
        .file("cpp/target_info.cpp")
        .file("cpp/work_groups.cpp")
        .file("cpp/item_bounds.cpp")
        .file("cpp/split_codegen.cpp")
        .include(include)
        .flag("-std=c++17")
        .flag("-fno-exceptions")
        .flag("-fno-rtti")
        .define("_GNU_SOURCE", None)
        .define("__STDC_CONSTANT_MACROS", None)
        .define("__STDC_FORMAT_MACROS", None)
        .define("__STDC_LIMIT_MACROS", None)
        .warnings(false)
        .compile("offload_jit_target_info");
}
