//! The AMD GPU backend without a GPU: code objects from the JIT (and from clang) carry the
//! target, the target-id features and the kernarg layout of every kernel in their metadata, and
//! the plugin's checks read them right; code objects for another processor or feature setting,
//! relocatable objects and damaged images are refused with the reason; the real ROCm runtime
//! (Debian's libhsa-runtime64) loads and reports no GPU in plain words.

use offload_amdgpu::metadata::{self, ArgKind};
use offload_amdgpu::target::{
    Setting, TargetId, code_object_target, gfx_of_mach, known_processors,
};
use offload_core::image::ImageKind;
use offload_tests::*;
use std::path::Path;

#[path = "../src/amdgpu_check.rs"]
#[allow(
    dead_code,
    reason = "the GPU check's module; these tests use part of it"
)]
mod amdgpu_check;

/// The kernels and the sizes of their explicit arguments, in order (from their C signatures).
const KERNELS: [(&str, &str, &[u32]); 5] = [
    ("saxpy", "saxpy", &[4, 4, 8, 8]),
    ("stencil2d", "stencil2d", &[4, 4, 8, 8]),
    (
        "args16",
        "args16",
        &[4, 8, 4, 8, 4, 4, 8, 8, 4, 8, 4, 8, 4, 8, 8, 4],
    ),
    ("atomics", "histogram", &[4, 4, 8, 8]),
    ("ids", "ids", &[8]),
];

fn info_of(image: &[u8]) -> offload_core::image::ElfInfo {
    match offload_core::classify(image).unwrap() {
        ImageKind::Elf(info) => info,
        other => panic!("not ELF: {other:?}"),
    }
}

fn device(isa: &str) -> TargetId {
    TargetId::from_isa_name(&format!("amdgcn-amd-amdhsa--{isa}")).unwrap()
}

#[test]
fn the_processor_table_agrees_with_llvm() {
    let dir = scratch("amdgpu-mach");
    let src = dir.join("k.c");
    std::fs::write(&src, "void f(void) {}\n").unwrap();
    let mut n = 0;
    for gfx in known_processors() {
        let obj = dir.join(format!("{gfx}.o"));
        clang(&[
            "-target",
            AMDGCN,
            &format!("-mcpu={gfx}"),
            "-nogpulib",
            "-c",
            src.to_str().unwrap(),
            "-o",
            obj.to_str().unwrap(),
        ]);
        let info = info_of(&std::fs::read(&obj).unwrap());
        assert_eq!(
            gfx_of_mach(info.flags & 0xff),
            Some(gfx),
            "e_flags {:#x}",
            info.flags
        );
        n += 1;
    }
    assert!(n >= 40, "{n} processors");
}

/// The offsets C's natural alignment gives arguments of these sizes.
fn natural_offsets(sizes: &[u32]) -> Vec<u32> {
    let mut at = 0u32;
    sizes
        .iter()
        .map(|s| {
            at = at.div_ceil(*s) * s;
            let o = at;
            at += s;
            o
        })
        .collect()
}

#[test]
fn jit_code_objects_carry_the_target_and_every_kernels_argument_layout() {
    for gfx in ["gfx90a", "gfx942", "gfx1100"] {
        for (file, kernel, sizes) in KERNELS {
            let image = amdgcn_jit(
                &amdgcn_bitcode(file, gfx),
                gfx,
                &[],
                &format!("{file}-{gfx}"),
            );
            let info = info_of(&image);
            assert_eq!(info.file_type, offload_core::image::elf_type::DYN);
            assert_eq!(info.os_abi, 64, "OS/ABI HSA");
            assert_eq!(image[8], 3, "code object v5");
            offload_amdgpu::check_native(&image, &ImageKind::Elf(info)).unwrap();
            let target = code_object_target(&info, image[8]).unwrap();
            assert_eq!(target.processor, gfx);
            target.runs_on(&device(gfx)).unwrap();
            let meta = metadata::read(&image).unwrap();
            assert_eq!(
                meta.target
                    .as_deref()
                    .map(|t| t.starts_with(&format!("amdgcn-amd-amdhsa--{gfx}"))),
                Some(true)
            );
            let k = meta
                .kernel(kernel)
                .unwrap_or_else(|| panic!("{file} {gfx}: {meta:?}"));
            assert_eq!(k.symbol, format!("{kernel}.kd"));
            let explicit: Vec<(u32, u32)> = k.explicit_args().map(|a| (a.offset, a.size)).collect();
            let want: Vec<(u32, u32)> = natural_offsets(sizes)
                .into_iter()
                .zip(sizes.iter().copied())
                .collect();
            assert_eq!(explicit, want, "{file} {gfx}");
            let pointers = k
                .explicit_args()
                .filter(|a| a.kind == ArgKind::Pointer)
                .count();
            assert_eq!(
                pointers,
                if matches!(file, "args16" | "ids") {
                    1
                } else {
                    2
                },
                "{file}"
            );
            // Code object v5: the dispatch shape travels as hidden arguments after the explicit ones.
            let hidden: Vec<&str> = k
                .args
                .iter()
                .filter_map(|a| match &a.kind {
                    ArgKind::Hidden(h) => Some(h.as_str()),
                    _ => None,
                })
                .collect();
            assert!(
                hidden.contains(&"hidden_group_size_x"),
                "{file} {gfx}: {hidden:?}"
            );
            let end = k.args.iter().map(|a| a.offset + a.size).max().unwrap_or(0);
            assert!(k.kernarg_segment_size >= end, "{file} {gfx}");
            assert!(matches!(k.wavefront_size, 32 | 64));
        }
    }
}

#[test]
fn target_id_features_are_read_and_checked_against_the_device() {
    let bc = amdgcn_bitcode("saxpy", "gfx90a");
    let mi250_xnack_off = device("gfx90a:sramecc+:xnack-");
    let mi250_xnack_on = device("gfx90a:sramecc+:xnack+");
    // Built for either way: runs on both.
    let any = amdgcn_jit(&bc, "gfx90a", &[], "tid-any");
    let t = code_object_target(&info_of(&any), any[8]).unwrap();
    assert_eq!((t.xnack, t.sramecc), (Setting::Any, Setting::Any));
    t.runs_on(&mi250_xnack_off).unwrap();
    t.runs_on(&mi250_xnack_on).unwrap();
    // Built with xnack on: only where it is on, and the error names both.
    let on = amdgcn_jit(&bc, "gfx90a", &["--features", "+xnack"], "tid-xnack");
    let t = code_object_target(&info_of(&on), on[8]).unwrap();
    assert_eq!(t.xnack, Setting::On);
    t.runs_on(&mi250_xnack_on).unwrap();
    let e = t.runs_on(&mi250_xnack_off).unwrap_err().to_string();
    assert!(
        e.contains("gfx90a:xnack+")
            && e.contains("gfx90a:sramecc+:xnack-")
            && e.contains("xnack on"),
        "{e}"
    );
    // Another processor.
    let mi100 = amdgcn_jit(&amdgcn_bitcode("saxpy", "gfx908"), "gfx908", &[], "tid-908");
    let e = code_object_target(&info_of(&mi100), mi100[8])
        .unwrap()
        .runs_on(&mi250_xnack_off)
        .unwrap_err()
        .to_string();
    assert!(e.contains("gfx908") && e.contains("gfx90a"), "{e}");
    // A processor without the feature.
    let navi = device("gfx1100");
    assert_eq!(navi.xnack, Setting::Unsupported);
    let e = t.runs_on(&navi).unwrap_err().to_string();
    assert!(e.contains("gfx1100"), "{e}");
}

fn clang_code_object(kernel: &str, gfx: &str, extra: &[&str], tag: &str) -> Vec<u8> {
    let out = scratch("amdgpu-clang").join(format!("{tag}.out"));
    let src = repo_root().join("kernels").join(format!("{kernel}.c"));
    let include = repo_root().join("include");
    let mut args = vec![
        "-O2",
        "-target",
        AMDGCN,
        "-nogpulib",
        "-I",
        include.to_str().unwrap(),
    ];
    let cpu = format!("-mcpu={gfx}");
    args.push(&cpu);
    args.extend_from_slice(extra);
    args.extend([src.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    clang(&args);
    std::fs::read(out).unwrap()
}

#[test]
fn clang_code_objects_pass_and_relocatable_or_foreign_ones_are_refused_with_the_reason() {
    let check = |image: &[u8]| {
        offload_core::classify(image)
            .and_then(|k| offload_amdgpu::check_native(image, &k))
            .map_err(|e| e.to_string())
    };
    let linked = clang_code_object("saxpy", "gfx90a", &[], "saxpy-linked");
    check(&linked).unwrap();
    let object = clang_code_object("saxpy", "gfx90a", &["-c"], "saxpy-object");
    let e = check(&object).unwrap_err();
    assert!(
        e.contains("relocatable object") && e.contains("needs linking"),
        "{e}"
    );
    let field = |at: usize, v: u8| {
        let mut m = linked.clone();
        m[at] = v;
        check(&m).unwrap_err()
    };
    let e = field(7, 0);
    assert!(e.contains("EI_OSABI") && e.contains("AMDGPU HSA"), "{e}");
    let e = field(8, 1);
    assert!(
        e.contains("EI_ABIVERSION") && e.contains("code object v3"),
        "{e}"
    );
    let e = field(48, 0x7e);
    assert!(e.contains("e_flags") && e.contains("0x7e"), "{e}");
    // The metadata note's type changed: the code object has no metadata.
    let note_at = linked
        .windows(8)
        .position(|w| w == b"AMDGPU\0\0")
        .expect("note name")
        - 4;
    let mut m = linked.clone();
    m[note_at] = 0x55;
    let e = check(&m).unwrap_err();
    assert!(
        e.contains("AMDGPU metadata") && e.contains("has none"),
        "{e}"
    );
}

#[test]
fn mutated_code_objects_are_errors_never_panics() {
    let image = amdgcn_jit(
        &amdgcn_bitcode("args16", "gfx90a"),
        "gfx90a",
        &[],
        "mutants",
    );
    let dev = device("gfx90a:sramecc+:xnack-");
    let noise = random_bytes(3 * 6000, 0xa3d);
    let (mut ok, mut refused) = (0, 0);
    for i in 0..6000usize {
        let mut m = image.clone();
        let r = &noise[3 * i..3 * i + 3];
        let at = (usize::from(r[0]) << 8 | usize::from(r[1])) % m.len();
        match i % 4 {
            0 => m[at] ^= r[2] | 1,
            1 => m.truncate(at.max(1)),
            2 => m[at % 64] = r[2],
            _ => {
                let end = (at + 8).min(m.len());
                m[at..end].fill(r[2]);
            }
        }
        let answer = std::panic::catch_unwind(|| {
            let kind = offload_core::classify(&m)?;
            offload_amdgpu::check_native(&m, &kind)?;
            let ImageKind::Elf(info) = kind else {
                return Ok(());
            };
            code_object_target(&info, m[8])?.runs_on(&dev)?;
            metadata::read(&m).map(|_| ())
        });
        match answer {
            Ok(Ok(())) => ok += 1,
            Ok(Err(e)) => {
                assert!(!e.to_string().is_empty());
                refused += 1;
            }
            Err(_) => panic!("mutation {i} panicked the checks"),
        }
    }
    println!("{ok} accepted, {refused} refused");
    assert!(refused > 1000 && ok > 0, "{ok} accepted, {refused} refused");
}

fn amdgpu_info(envs: &[(&str, &str)]) -> serde_json::Value {
    let out = offload(&["info", "--json"], envs);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    plugin_json(&json, "amdgpu").clone()
}

#[test]
fn the_real_rocm_runtime_loads_and_says_why_there_is_no_gpu() {
    // Not a pass where it cannot run: scripts/test.sh leaves it out on a machine with
    // /dev/kfd and names it as skipped.
    assert!(
        !Path::new("/dev/kfd").exists(),
        "this machine has /dev/kfd (an AMD GPU driver): the no-GPU path cannot be reached here"
    );
    let amd = amdgpu_info(&[]);
    assert_eq!(amd["status"], "no-devices", "{amd}");
    let reason = amd["reason"].as_str().unwrap();
    // Loaded and initialised for real (the message comes after hsa_init), said in plain words.
    assert!(
        reason.contains("the HSA runtime 'libhsa-runtime64.so.1' found no AMD GPU"),
        "{reason}"
    );
    assert!(reason.contains("/dev/kfd does not exist"), "{reason}");
    assert!(!reason.contains("HSA_STATUS"), "{reason}");
    assert_eq!(amd["devices"].as_array().unwrap().len(), 0);
    // A bad OFFLOAD_HSA_RUNTIME names the variable.
    let amd = amdgpu_info(&[("OFFLOAD_HSA_RUNTIME", "/no such/libhsa.so")]);
    assert_eq!(amd["status"], "failed", "{amd}");
    assert!(
        amd["reason"]
            .as_str()
            .unwrap()
            .contains("OFFLOAD_HSA_RUNTIME='/no such/libhsa.so'")
    );
    // Every amdgcn image: exit 1, one line, saying there is no AMD GPU and why.
    let dir = scratch("amdgpu-no-device");
    let bc = amdgcn_bitcode("saxpy", "gfx90a");
    let co = dir.join("saxpy.hsaco");
    std::fs::write(&co, amdgcn_jit(&bc, "gfx90a", &[], "nodev")).unwrap();
    for image in [&bc, &co] {
        let out = offload(&["run", image.to_str().unwrap(), "--kernel", "saxpy"], &[]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{}: {err}", image.display());
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains("no device")
                && err.contains("plugin 'amdgpu' can run this image")
                && err.contains("/dev/kfd does not exist"),
            "{}: {err}",
            image.display()
        );
    }
}

/// With an AMD GPU: every kernel from code objects and bitcode, compared bit for bit with the
/// host plugin's results (the check `scripts/gpu-check.sh amdgpu` runs, on images built now).
#[test]
#[ignore = "needs an AMD GPU: scripts/test.sh runs it where `offload info` lists one, scripts/gpu-check.sh amdgpu always"]
fn on_an_amd_gpu_every_kernel_and_image_kind_matches_the_host() {
    let amd = amdgpu_info(&[]);
    if amd["status"] != "ok" {
        panic!("this test needs an AMD GPU: {}", amd["reason"]);
    }
    let gfx = amd["devices"][0]["compute_unit"]
        .as_str()
        .unwrap()
        .to_string();
    let dir = scratch("amdgpu-gpu");
    amdgpu_check::prepare(&dir, &[&gfx]).unwrap();
    let rt = offload::Runtime::with_plugin_dirs(&[build_dir()], None);
    if let Err(e) =
        amdgpu_check::run(&dir, &rt, &build_dir().join("offload")).and_then(|r| r.result())
    {
        panic!("{e}");
    }
}
