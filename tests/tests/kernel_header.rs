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

/// A kernel with every part of the header (IDs, block size, grid size, a barrier, a shared
/// array) and OFFLOAD_GLOBAL pointers, which compiles as C for the host and the GPUs and as
/// OpenCL C for SPIR-V.
const PORTABLE: &str = "#include \"offload_kernel.h\"\n\
OFFLOAD_KERNEL void block_rev(OFFLOAD_GLOBAL const unsigned *in, OFFLOAD_GLOBAL unsigned *out) {\n\
  OFFLOAD_SHARED unsigned tile[256];\n\
  unsigned t = offload_thread_id(0), B = offload_block_dim(0), b = offload_block_id(0);\n\
  tile[t] = in[b * B + t];\n\
  offload_barrier();\n\
  out[b * B + t] = tile[B - 1 - t] + offload_grid_dim(1) + offload_thread_id(3);\n\
}\n\
OFFLOAD_SIGNATURE(block_rev, const unsigned *, unsigned *);\n\
OFFLOAD_PARAMS(block_rev, const unsigned in[1], unsigned out[1]);\n";

#[test]
fn opencl_c_for_spirv_maps_ids_barrier_and_shared_memory_to_the_opencl_built_ins() {
    let dir = scratch("header-spirv");
    let src = dir.join("block_rev.c");
    std::fs::write(&src, PORTABLE).unwrap();
    let include = repo_root().join("include");
    let ll = dir.join("block_rev.spirv64.ll");
    clang(&[
        "-target",
        "spirv64",
        "-x",
        "cl",
        "-cl-std=CL2.0",
        "-O2",
        "-Wall",
        "-Werror",
        "-emit-llvm",
        "-S",
        "-I",
        include.to_str().unwrap(),
        src.to_str().unwrap(),
        "-o",
        ll.to_str().unwrap(),
    ]);
    let ir = std::fs::read_to_string(&ll).unwrap();
    for want in [
        "define spir_kernel void @block_rev(ptr addrspace(1)",
        "@_Z12get_local_idj(i32 noundef 0)",
        "@_Z12get_group_idj(i32 noundef 0)",
        "@_Z14get_local_sizej(i32 noundef 0)",
        "@_Z14get_num_groupsj(i32 noundef 1)",
        // CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE
        "@_Z7barrierj(i32 noundef 3)",
        "addrspace(3) global [256 x i32]",
    ] {
        assert!(ir.contains(want), "'{want}' not in:\n{ir}");
    }
    // No host-only records in OpenCL C, and IDs past z are 0 as on every target.
    assert!(!ir.contains("__offload_signature"), "{ir}");
    assert!(!ir.contains("@_Z12get_local_idj(i32 noundef 3)"), "{ir}");
    // The same source as C: host, NVPTX and AMDGPU.
    let so = dir.join("block_rev.so");
    clang(&[
        "-O2",
        "-fPIC",
        "-shared",
        "-Wall",
        "-Werror",
        "-I",
        include.to_str().unwrap(),
        src.to_str().unwrap(),
        "-o",
        so.to_str().unwrap(),
    ]);
    for target in [
        &["-target", "nvptx64-nvidia-cuda", "-march=sm_80"][..],
        &["-target", "amdgcn-amd-amdhsa", "-mcpu=gfx90a", "-nogpulib"][..],
    ] {
        let mut args = target.to_vec();
        let out = dir.join("block_rev.gpu.ll");
        args.extend_from_slice(&[
            "-O2",
            "-Wall",
            "-Werror",
            "-emit-llvm",
            "-S",
            "-I",
            include.to_str().unwrap(),
            src.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ]);
        clang(&args);
    }
}
