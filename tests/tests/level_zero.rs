//! The Level Zero (Intel GPU) backend without a GPU: the real loader (Debian's libze1) with no
//! driver reports no device in plain words; SPIR-V modules and native binaries are checked
//! before any driver sees them, and damaged ones (seeded mutants) are refused naming the word
//! or field at fault, never a crash; bitcode for spirv64 meets an LLVM without the SPIR-V
//! target and says so.

use offload_core::image::ImageKind;
use offload_level_zero::{check_native, spirv, zebin};
use offload_tests::*;

#[test]
fn the_real_loader_without_a_driver_reports_no_device_with_the_reason() {
    let out = offload(&["info", "--json"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let p = plugin_json(&info, "level-zero");
    assert_eq!(p["status"], "no-devices", "{p}");
    let reason = p["reason"].as_str().unwrap();
    assert!(reason.contains("libze_loader.so.1"), "{reason}");
    assert!(reason.contains("ZE_RESULT_ERROR_UNINITIALIZED"), "{reason}");
    assert!(
        reason.contains("libze_intel_gpu.so.1: cannot open shared object file"),
        "{reason}"
    );
    // A run of a SPIR-V image: one line, the plugin that could run it and why it cannot.
    let dir = scratch("level-zero-nodev");
    let image = dir.join("saxpy.spv");
    std::fs::write(&image, spirv("saxpy")).unwrap();
    let out = offload(&["run", image.to_str().unwrap(), "--kernel", "saxpy"], &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("plugin 'level-zero' can run this image but has no device"),
        "{err}"
    );
}

#[test]
fn alternate_drivers_and_the_loader_variable_are_named_in_the_reason() {
    let out = offload(
        &["info", "--json"],
        &[("ZE_ENABLE_ALT_DRIVERS", "/nonexistent/libze_x.so")],
    );
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let reason = plugin_json(&info, "level-zero")["reason"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        reason.contains("ZE_ENABLE_ALT_DRIVERS='/nonexistent/libze_x.so'"),
        "{reason}"
    );
    assert!(
        reason.contains("/nonexistent/libze_x.so: cannot open"),
        "{reason}"
    );
    let out = offload(
        &["info", "--json"],
        &[("OFFLOAD_LEVEL_ZERO_LOADER", "/nonexistent/libze.so")],
    );
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert!(
        text.contains("OFFLOAD_LEVEL_ZERO_LOADER='/nonexistent/libze.so': no such file"),
        "{text}"
    );
    // A file that is no loader: its entry points are missing, an error naming the call.
    let out = offload(
        &["info", "--json"],
        &[(
            "OFFLOAD_LEVEL_ZERO_LOADER",
            "/lib/x86_64-linux-gnu/libc.so.6",
        )],
    );
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let reason = plugin_json(&info, "level-zero")["reason"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(reason.contains("has no zeInit"), "{reason}");
}

#[test]
fn spirv_images_are_classified_routed_and_checked() {
    for name in ["saxpy", "add_k", "reverse", "fault"] {
        let bytes = spirv(name);
        let kind = offload_core::classify(&bytes).unwrap();
        assert_eq!(kind, ImageKind::SpirV);
        check_native(&bytes, &kind).unwrap();
        let m = spirv::parse(&bytes).unwrap();
        assert_eq!(m.kernel_names(), vec![name.to_string()]);
    }
    let reverse = spirv::parse(&spirv("reverse")).unwrap();
    assert_eq!(
        reverse.kernel("reverse").unwrap().params.as_deref(),
        Some(
            &[
                spirv::Param::Value(offload_core::jit::ParamType::Ptr),
                spirv::Param::Value(offload_core::jit::ParamType::Ptr),
                spirv::Param::Local
            ][..]
        )
    );
    // A Vulkan compute module has no kernel for Level Zero.
    let compute = spirv("compute");
    let e = check_native(&compute, &ImageKind::SpirV)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no kernel"), "{e}");
    let e = spirv::parse(&compute)
        .unwrap()
        .kernel("main")
        .unwrap_err()
        .to_string();
    assert!(e.contains("GLCompute"), "{e}");
    // A module with 32-bit pointers: refused, saying why (pointer arguments are 64-bit).
    let mut words: Vec<u32> = spirv("saxpy")
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes(w.try_into().unwrap()))
        .collect();
    let at = (5..words.len())
        .find(|&i| words[i] == (3 << 16) | 14)
        .expect("an OpMemoryModel");
    assert_eq!(words[at + 1], 2, "Physical64");
    words[at + 1] = 1;
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let e = check_native(&bytes, &ImageKind::SpirV).unwrap_err();
    assert!(matches!(e, offload_core::Error::Unsupported(_)), "{e:?}");
    assert!(e.to_string().contains("Physical32"), "{e}");
    // Big-endian words are named as such.
    let mut swapped = spirv("saxpy");
    for w in swapped.chunks_exact_mut(4) {
        w.reverse();
    }
    let e = offload_core::classify(&swapped).unwrap_err().to_string();
    assert!(e.contains("big-endian"), "{e}");
}

#[test]
fn zebins_are_checked_as_elf_and_their_kernels_read() {
    let z = synthetic_zebin(&[("add_k", 3, 0), ("saxpy", 4, 0)], None);
    match offload_core::classify(&z).unwrap() {
        ImageKind::Elf(info) => assert_eq!(info.machine, 205),
        other => panic!("{other:?}"),
    }
    assert_eq!(zebin::read(&z).unwrap().kernels, vec!["add_k", "saxpy"]);
    // Not a relocatable or zebin type: refused naming the field.
    let mut exe = z.clone();
    exe[16..18].copy_from_slice(&2u16.to_le_bytes());
    let e = zebin::read(&exe).unwrap_err().to_string();
    assert!(e.contains("e_type"), "{e}");
    // No kernel section.
    let e = zebin::read(&synthetic_zebin(&[], None))
        .unwrap_err()
        .to_string();
    assert!(e.contains("no kernel"), "{e}");
}

/// Seeded mutants of `good` through the plugin-level check: each is refused (an InvalidImage
/// or Unsupported error) or accepted, none panics. Returns (accepted, refused).
fn mutants(good: &[u8], seed: u64, rounds: usize) -> (usize, usize) {
    let mut rng = offload_core::rand::XorShift(seed);
    let (mut ok, mut refused) = (0, 0);
    for _ in 0..rounds {
        let mut b = good.to_vec();
        for _ in 0..1 + rng.next_u64() % 4 {
            let i = (rng.next_u64() as usize) % b.len();
            b[i] = rng.next_u64() as u8;
        }
        if rng.next_u64() % 8 == 0 {
            let len = (rng.next_u64() as usize) % b.len();
            b.truncate(len.max(1));
        }
        let checked = offload_core::classify(&b).and_then(|kind| match kind {
            // A zebin's .ze_info is read too (which parameters are `__local`).
            ImageKind::SpirV | ImageKind::Elf(_) => check_native(&b, &kind),
            other => Err(offload_core::Error::InvalidImage(other.describe().into())),
        });
        match checked {
            Ok(()) => ok += 1,
            Err(offload_core::Error::InvalidImage(_) | offload_core::Error::Unsupported(_)) => {
                refused += 1
            }
            Err(e) => panic!("a mutant gave {e:?}"),
        }
    }
    (ok, refused)
}

#[test]
fn seeded_mutants_of_spirv_and_zebins_are_refused_or_accepted_never_a_crash() {
    let (ok, refused) = mutants(&spirv("reverse"), 0x5b1, 4000);
    assert!(
        ok > 0 && refused > 0,
        "SPIR-V: {ok} accepted, {refused} refused"
    );
    let ze_info = "version: '1.11'\nkernels:\n  - name: add_k\n    payload_arguments:\n      \
                   - arg_type: arg_bypointer\n        arg_index: 2\n        addrmode: slm\n        \
                   addrspace: local\n";
    let (ok, refused) = mutants(
        &synthetic_zebin(&[("add_k", 3, 4)], Some(ze_info)),
        0x2eb,
        4000,
    );
    assert!(refused > 0, "zebin: {ok} accepted, {refused} refused");
}

#[test]
fn mutated_images_through_the_fake_driver_never_take_the_process_down() {
    // What passes the plugin's checks reaches the (fake) driver through the real loader; the
    // process survives every one, in a child so that a crash would show as one.
    let dir = scratch("level-zero-mutants");
    let good = spirv("saxpy");
    let mut rng = offload_core::rand::XorShift(0x7e0);
    let mut loaded = 0;
    for i in 0..200 {
        let mut b = good.clone();
        for _ in 0..1 + rng.next_u64() % 3 {
            let at = 20 + (rng.next_u64() as usize) % (b.len() - 20);
            b[at] = rng.next_u64() as u8;
        }
        let path = dir.join(format!("m{i}.spv"));
        std::fs::write(&path, &b).unwrap();
        let out = offload(
            &[
                "run",
                path.to_str().unwrap(),
                "--kernel",
                "saxpy",
                "--arg",
                "i32:16",
                "--arg",
                "f32:2",
                "--arg",
                "buf:f32:16:iota",
                "--arg",
                "buf:f32:16:fill=1",
                "--block",
                "16",
            ],
            &[
                ("ZE_ENABLE_ALT_DRIVERS", fake_ze_driver().to_str().unwrap()),
                ("OFFLOAD_PLUGINS", "level-zero"),
            ],
        );
        let code = out.status.code();
        assert!(
            matches!(code, Some(0) | Some(1) | Some(2)),
            "mutant {i}: exit {code:?}: {}",
            stderr(&out)
        );
        loaded += usize::from(code == Some(0));
    }
    assert!(loaded > 0, "no mutant ran at all");
}

#[test]
fn spirv64_bitcode_meets_an_llvm_without_the_spirv_target_and_says_so() {
    let dir = scratch("level-zero-bitcode");
    let src = dir.join("k.cl");
    std::fs::write(
        &src,
        "__kernel void saxpy(int n, float a, __global const float *x, __global float *y) {\n\
           size_t i = get_global_id(0);\n\
           if (i < n) y[i] = a * x[i] + y[i];\n\
         }\n",
    )
    .unwrap();
    let bc = dir.join("k.bc");
    clang(&[
        "-target",
        "spirv64",
        "-x",
        "cl",
        "-cl-std=CL2.0",
        "-O2",
        "-c",
        "-emit-llvm",
        src.to_str().unwrap(),
        "-o",
        bc.to_str().unwrap(),
    ]);
    let out = offload(
        &[
            "jit",
            bc.to_str().unwrap(),
            "--target",
            "spirv64-unknown-unknown",
            "--cpu",
            "generic",
            "-o",
            dir.join("k.spv").to_str().unwrap(),
        ],
        &[("OFFLOAD_CACHE", "0")],
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("LLVM 19.1"), "{err}");
    assert!(err.contains("has no SPIR-V target"), "{err}");
    assert!(err.contains("docs/level-zero.md"), "{err}");
    // The runtime routes such bitcode to the level-zero plugin (which has no device here).
    let out = offload(&["run", bc.to_str().unwrap(), "--kernel", "saxpy"], &[]);
    let err = stderr(&out);
    assert!(err.contains("level-zero"), "{err}");
}
