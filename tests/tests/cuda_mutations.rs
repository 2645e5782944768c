//! Seeded mutations of real CUDA images (cubins from the real `ptxas`, PTX from the JIT, fat
//! binaries holding both) against every check of the CUDA plugin, and through it to a driver
//! (the fake one: a driver without a GPU that copies what it is given by the extents the image
//! declares, so an image the plugin lets through with extents past its end crashes it). Every
//! mutant is refused with an error or loaded; none panics the plugin or crashes the process.

use offload_core::{Error, ImageKind};
use offload_cuda::fatbin::{self, EntryKind};
use offload_cuda::sm::{Sm, cubin_sm, ptx_target};
use offload_tests::*;

fn mutate(original: &[u8], i: usize, r: &[u8]) -> Vec<u8> {
    let mut image = original.to_vec();
    let at = (usize::from(r[0]) << 8 | usize::from(r[1])) % image.len();
    match i % 5 {
        0 => image[at] ^= r[2] | 1,
        1 => image.truncate(at.max(1)),
        // Header fields (offsets, counts, sizes, flags) are where parsers go wrong.
        2 => image[at % 64] = r[2],
        3 => {
            let end = (at + 8).min(image.len());
            image[at..end].fill(r[2]);
        }
        _ => image.splice(at..at, r.iter().copied()).for_each(drop),
    }
    image
}

/// Every check a CUDA device of `sm` makes, without the driver.
fn checks(image: &[u8], sm: Sm) -> Result<(), Error> {
    let kind = offload_core::classify(image)?;
    offload_cuda::check_native(image, &kind)?;
    match kind {
        ImageKind::Elf(_) => cubin_sm(image)?.cubin_runs_on(sm),
        ImageKind::Ptx => ptx_target(image)?.ptx_runs_on(sm),
        ImageKind::CudaFatbin => fatbin::select(&fatbin::entries(image)?, sm).map(|_| ()),
        _ => Ok(()),
    }
}

#[test]
fn mutated_cubins_ptx_and_fatbins_are_refused_or_loaded_never_crash() {
    let bc = nvptx_bitcode("stencil2d", "sm_90");
    let ptx = nvptx_jit(&bc, "sm_90", &["--emit-ptx"], "mutations-ptx");
    let cubin = ptxas_cubin(&ptx, "sm_90", "mutations");
    let cubin100 = ptxas_cubin(&ptx, "sm_100a", "mutations");
    let fat = fatbin::build(&[
        (EntryKind::Ptx, 90, &ptx),
        (EntryKind::Cubin, 90, &cubin),
        (EntryKind::Cubin, 100, &cubin100),
    ]);
    // In process: thousands of mutants against the checks, for three kinds of device.
    let originals: [(&str, &[u8]); 4] = [
        ("cubin", &cubin),
        ("sm_100a cubin", &cubin100),
        ("PTX", &ptx),
        ("fatbin", &fat),
    ];
    let noise = random_bytes(3 * 20_000, 0xc0da);
    let mut tally = std::collections::BTreeMap::new();
    for (what, original) in originals {
        let (mut accepted, mut refused) = (0, 0);
        for i in 0..5000usize {
            let image = mutate(original, i, &noise[3 * (i + 5000 * tally.len())..][..3]);
            for sm in [Sm::device(9, 0), Sm::device(8, 0), Sm::device(10, 0)] {
                match std::panic::catch_unwind(|| checks(&image, sm)) {
                    Ok(Ok(())) => accepted += 1,
                    Ok(Err(e)) => {
                        assert!(!e.to_string().is_empty());
                        refused += 1
                    }
                    Err(_) => panic!("{what} mutation {i} panicked the checks"),
                }
            }
        }
        tally.insert(what, (accepted, refused));
    }
    println!("in-process checks (accepted, refused) per original: {tally:?}");
    for (what, (_, refused)) in &tally {
        assert!(
            *refused > 1000,
            "{what}: most mutants are refused somewhere: {tally:?}"
        );
    }

    // Through the plugin and a driver, in this process: every mutant is answered.
    let log = scratch("cuda-mutations").join("fake.log");
    // SAFETY: this test binary has this one test; nothing else reads the environment yet.
    unsafe {
        std::env::set_var("OFFLOAD_CUDA_DRIVER", fake_cuda_driver());
        std::env::set_var("FAKE_CUDA_LOG", &log);
    }
    let rt = offload::Runtime::with_plugin_dirs(&[build_dir()], Some(&["cuda".to_string()]));
    let device = rt.device("cuda", 0).unwrap();
    let (mut loaded, mut refused) = (0, 0);
    for (n, (what, original)) in originals.iter().enumerate() {
        for i in 0..400usize {
            let image = mutate(original, i, &noise[3 * (i + 400 * n)..][..3]);
            match offload_tests::load(&device, &image) {
                Ok(program) => {
                    loaded += 1;
                    drop(program);
                }
                Err(Error::PluginPanic(m)) => {
                    panic!("{what} mutation {i} panicked the plugin: {m}")
                }
                Err(e) => {
                    assert!(!e.to_string().is_empty());
                    refused += 1;
                }
            }
            if let Err(Error::PluginPanic(m)) = rt.route(&image) {
                panic!("{what} mutation {i} panicked routing: {m}");
            }
        }
    }
    println!("through the plugin to the fake driver: {loaded} loaded, {refused} refused");
    assert!(
        loaded > 0 && refused > 0,
        "{loaded} loaded, {refused} refused"
    );
}
