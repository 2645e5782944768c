//! Every kind of malformed image gets its own specific error, through routing, through the
//! host plugin directly, and through the `offload` command (exit status 1, one line).

use offload::Error;
use offload_core::image::machine;
use offload_tests::*;

fn saxpy() -> Vec<u8> {
    std::fs::read(host_kernel("saxpy")).unwrap()
}

fn patched(f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut b = saxpy();
    f(&mut b);
    b
}

/// (case, image, text the routed error must contain)
fn cases() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let full = saxpy();
    let other = if machine::host() == machine::AARCH64 {
        machine::X86_64
    } else {
        machine::AARCH64
    };
    vec![
        ("empty", vec![], "image is empty"),
        (
            "truncated inside the header",
            full[..40].to_vec(),
            "ELF64 file header needs 64",
        ),
        (
            "truncated identification",
            full[..10].to_vec(),
            "identification alone needs 16",
        ),
        (
            "truncated body",
            full[..full.len() / 3].to_vec(),
            "malformed ELF64",
        ),
        ("wrong class", patched(|b| b[4] = 1), "ELFCLASS32"),
        (
            "invalid class byte",
            patched(|b| b[4] = 7),
            "EI_CLASS (offset 4) = 7",
        ),
        ("wrong endianness", patched(|b| b[5] = 2), "big-endian"),
        (
            "wrong machine",
            patched(|b| b[18..20].copy_from_slice(&other.to_le_bytes())),
            "no loaded plugin serves ELF machine",
        ),
        ("relocatable object", patched(|b| b[16] = 1), "ET_REL"),
        ("executable", patched(|b| b[16] = 2), "ET_EXEC"),
        (
            "not ELF",
            b"#!/bin/sh\necho this is a shell script\n".to_vec(),
            "unknown image format",
        ),
        (
            "random bytes",
            random_bytes(4096, 0x5eed),
            "unknown image format",
        ),
    ]
}

#[test]
fn routing_names_the_problem_for_every_malformed_image() {
    let rt = host_runtime();
    for (case, image, want) in cases() {
        let e = rt.route(&image).map(|d| d.to_string()).unwrap_err();
        assert!(
            e.to_string().contains(want),
            "{case}: '{e}' should contain '{want}'"
        );
        assert!(
            matches!(e, Error::InvalidImage(_) | Error::Unsupported(_)),
            "{case}: unexpected kind {e:?}"
        );
    }
}

#[test]
fn the_host_plugin_refuses_each_malformed_image_when_asked_directly() {
    let rt = host_runtime();
    let device = rt.device("host", 0).unwrap();
    for (case, image, want) in cases() {
        let e = offload_tests::load(&device, &image)
            .map(|_| ())
            .unwrap_err();
        assert!(matches!(e, Error::InvalidImage(_)), "{case}: {e:?}");
        let want = if want.starts_with("no loaded plugin") {
            "e_machine"
        } else {
            want
        };
        assert!(
            e.to_string().contains(want),
            "{case}: '{e}' should contain '{want}'"
        );
    }
    // The good image still loads after all that.
    offload_tests::load(&device, &saxpy()).unwrap();
}

#[test]
fn a_real_relocatable_object_is_refused_with_a_hint() {
    let dir = scratch("reloc");
    let obj = dir.join("saxpy.o");
    let include = repo_root().join("include");
    clang(&[
        "-c",
        "-fPIC",
        "-I",
        include.to_str().unwrap(),
        repo_root().join("kernels/saxpy.c").to_str().unwrap(),
        "-o",
        obj.to_str().unwrap(),
    ]);
    let out = offload(&["run", obj.to_str().unwrap(), "--kernel", "saxpy"], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "one error line: {err}");
    assert!(
        err.contains("ET_REL") && err.contains("only ET_DYN"),
        "{err}"
    );
    assert!(err.contains("saxpy.o"), "the error names the image: {err}");
}

#[test]
fn malformed_images_through_the_command_fail_with_status_1_and_one_line() {
    let dir = scratch("malformed-cli");
    for (i, (case, image, want)) in cases().into_iter().enumerate() {
        let path = dir.join(format!("case{i}.img"));
        std::fs::write(&path, &image).unwrap();
        let out = offload(&["run", path.to_str().unwrap(), "--kernel", "saxpy"], &[]);
        assert_eq!(out.status.code(), Some(1), "{case}");
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{case}: {err}");
        assert!(err.contains(want), "{case}: {err}");
        assert!(!err.contains("panicked"), "{case}: {err}");
    }
}

#[test]
fn thousands_of_mutated_images_never_panic_the_checks() {
    // Byte flips, truncations and header-field rewrites of a real kernel image: every one must
    // be answered (accepted or refused with an error), never with a panic inside the plugin
    // (which the ABI layer would report as PluginPanic) or a crash. Only the checks run: a
    // corrupted image that passes them is not handed to the dynamic loader here.
    let rt = host_runtime();
    let device = rt.device("host", 0).unwrap();
    let original = saxpy();
    let noise = random_bytes(3 * 4000, 0xfeed);
    let (mut accepted, mut refused) = (0, 0);
    for i in 0..4000usize {
        let mut image = original.clone();
        let r = &noise[3 * i..3 * i + 3];
        let at = (usize::from(r[0]) << 8 | usize::from(r[1])) % image.len();
        match i % 4 {
            0 => image[at] ^= r[2] | 1,
            1 => image.truncate(at.max(1)),
            // Header fields (offsets, counts, sizes) are where parsers go wrong.
            2 => image[at % 64] = r[2],
            _ => {
                let end = (at + 8).min(image.len());
                image[at..end].fill(r[2]);
            }
        }
        // SAFETY: the device API is used on this test's own allocations only, with no HostBuffer or safe-layer queue on them.
        match unsafe { offload::raw::device(&device) }.check_image(&image) {
            Ok(()) => accepted += 1,
            Err(Error::PluginPanic(m)) => panic!("mutation {i} panicked the plugin: {m}"),
            Err(_) => refused += 1,
        }
        if let Err(Error::PluginPanic(m)) = rt.route(&image) {
            panic!("mutation {i} panicked routing: {m}");
        }
    }
    assert!(
        refused > 1000,
        "most mutations must be refused ({accepted} accepted, {refused} refused)"
    );
}
