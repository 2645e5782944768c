//! Compiles the C++ parts (`cpp/`: target information, the host's work-group functions in
//! `cpp/work_groups/`, split code generation) against LLVM 19's headers, found with
//! `llvm-config-19` (or `$LLVM_CONFIG`).

use std::process::Command;

fn main() {
    const SOURCES: [&str; 9] = [
        "cpp/target_info.cpp",
        "cpp/split_codegen.cpp",
        "cpp/work_groups/work_groups.cpp",
        "cpp/work_groups/common.cpp",
        "cpp/work_groups/plain.cpp",
        "cpp/work_groups/item_bounds.cpp",
        "cpp/work_groups/regions.cpp",
        "cpp/work_groups/frame.cpp",
        "cpp/work_groups/emit.cpp",
    ];
    // A directory: cargo looks at every file under it (the headers too).
    println!("cargo:rerun-if-changed=cpp");
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
        .files(SOURCES)
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
