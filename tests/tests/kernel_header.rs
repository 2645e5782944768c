//! `include/offload_kernel.h` compiles one kernel source for every backend with clang-19, and
//! the kernels come out as exported entry points on each target. (Running the GPU builds
//! comes with the CUDA and AMDGPU plugins.)

use object::{Object, ObjectSymbol, SymbolKind};
use offload_tests::*;
use std::process::Command;

const KERNELS: [(&str, &[&str]); 6] = [
    ("saxpy", &["saxpy"]),
    ("stencil2d", &["stencil2d"]),
    ("args16", &["args16"]),
    ("atomics", &["histogram"]),
    ("ids", &["ids"]),
    ("empty", &["empty"]),
];

fn compile(target: &[&str], name: &str, ext: &str, extra: &[&str]) -> std::path::PathBuf {
    let dir = scratch("header");
    let out = dir.join(format!(
        "{name}.{}.{ext}",
        target.join("_").replace(['=', '-'], "_")
    ));
    let src = repo_root().join("kernels").join(format!("{name}.c"));
    let include = repo_root().join("include");
    let mut args = vec![
        "-O2",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-I",
        include.to_str().unwrap(),
    ];
    args.extend_from_slice(target);
    args.extend_from_slice(extra);
    args.extend([src.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    clang(&args);
    out
}

#[test]
fn nvptx64_kernels_are_visible_entries() {
    for (file, kernels) in KERNELS {
        let ptx = compile(
            &["-target", "nvptx64-nvidia-cuda", "-march=sm_90"],
            file,
            "ptx",
            &["-S"],
        );
        let text = std::fs::read_to_string(&ptx).unwrap();
        for k in kernels {
            assert!(
                text.contains(&format!(".visible .entry {k}(")),
                "{file}: no entry {k} in\n{text}"
            );
        }
        if file == "ids" {
            for reg in ["%tid.z", "%ctaid.y", "%ntid.x", "%nctaid.z"] {
                assert!(text.contains(reg), "ids kernel should read {reg}");
            }
        }
        let bc = compile(
            &["-target", "nvptx64-nvidia-cuda", "-march=sm_90"],
            file,
            "bc",
            &["-emit-llvm", "-c"],
        );
        assert_eq!(&std::fs::read(&bc).unwrap()[..4], b"BC\xc0\xde");
    }
}

#[test]
fn amdgcn_kernels_stay_global_after_linking() {
    for (file, kernels) in KERNELS {
        let obj = compile(
            &["-target", "amdgcn-amd-amdhsa", "-mcpu=gfx90a", "-nogpulib"],
            file,
            "o",
            &["-c"],
        );
        let linked = obj.with_extension("so");
        let out = Command::new("ld.lld-19")
            .args([
                "-shared",
                obj.to_str().unwrap(),
                "-o",
                linked.to_str().unwrap(),
            ])
            .output()
            .expect("ld.lld-19 (run scripts/setup.sh)");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let bytes = std::fs::read(&linked).unwrap();
        let file_obj = object::File::parse(&*bytes).unwrap();
        assert_eq!(
            u16::from_le_bytes([bytes[18], bytes[19]]),
            offload_core::image::machine::AMDGPU
        );
        for k in kernels {
            let sym = file_obj
                .dynamic_symbols()
                .find(|s| s.name() == Ok(k))
                .unwrap_or_else(|| panic!("{file}: kernel {k} not in .dynsym"));
            assert!(sym.is_global(), "{file}: {k} must be global");
            assert_eq!(sym.kind(), SymbolKind::Text);
            let descriptor = format!("{k}.kd");
            assert!(
                file_obj
                    .dynamic_symbols()
                    .any(|s| s.name() == Ok(descriptor.as_str())),
                "{file}: no {descriptor}"
            );
        }
        let bc = compile(
            &["-target", "amdgcn-amd-amdhsa", "-mcpu=gfx90a", "-nogpulib"],
            file,
            "bc",
            &["-emit-llvm", "-c"],
        );
        assert_eq!(&std::fs::read(&bc).unwrap()[..4], b"BC\xc0\xde");
    }
}

#[test]
fn host_kernels_export_the_entry_and_the_context() {
    for (file, kernels) in KERNELS {
        let bytes = std::fs::read(host_kernel(file)).unwrap();
        let f = object::File::parse(&*bytes).unwrap();
        for k in kernels {
            assert!(
                f.dynamic_symbols()
                    .any(|s| s.name() == Ok(k) && s.kind() == SymbolKind::Text),
                "{file}: {k}"
            );
        }
        assert!(
            f.dynamic_symbols()
                .any(|s| s.name() == Ok("__offload_host_context")
                    && s.kind() == SymbolKind::Data
                    && s.size() == 8),
            "{file}: the work-item context getter must be an exported pointer variable"
        );
    }
}
