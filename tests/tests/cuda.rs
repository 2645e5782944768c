//! The CUDA backend. Without a GPU (here): nvptx64 bitcode through the JIT and the real `ptxas`
//! into cubins that the plugin's own checks accept for the right SM and refuse for others, fat
//! binaries that give each device its best entry, and a machine without a driver (or with a
//! stub or broken one) that reports 0 devices with the reason. With a GPU: every kernel from
//! cubin, PTX, fatbin and bitcode, compared with the host plugin's results.

use offload_core::image::ImageKind;
use offload_cuda::fatbin::{self, EntryKind};
use offload_cuda::sm::{Sm, cubin_sm, ptx_target};
use offload_tests::nvptx_jit as jit;

#[path = "../src/cuda_check.rs"]
#[allow(
    dead_code,
    reason = "the GPU check's module; these tests use part of it"
)]
mod cuda_check;
use offload_tests::*;
use std::path::{Path, PathBuf};

const KERNELS: [&str; 5] = ["saxpy", "stencil2d", "args16", "atomics", "ids"];

#[test]
fn nvptx_bitcode_becomes_a_cubin_that_sm_90_accepts_and_sm_80_refuses() {
    let h200 = Sm::device(9, 0);
    let a100 = Sm::device(8, 0);
    for k in KERNELS {
        let bc = nvptx_bitcode(k, "sm_90");
        let cubin = jit(&bc, "sm_90", &[], &format!("{k}-sm90"));
        assert_eq!(&cubin[..4], b"\x7fELF");
        assert_eq!(
            u16::from_le_bytes([cubin[18], cubin[19]]),
            190,
            "{k}: EM_CUDA"
        );
        let kind = offload_core::classify(&cubin).unwrap();
        offload_cuda::check_native(&cubin, &kind).unwrap();
        let sm = cubin_sm(&cubin).unwrap();
        assert_eq!(sm.to_string(), "sm_90", "{k}");
        sm.cubin_runs_on(h200).unwrap();
        let e = sm.cubin_runs_on(a100).unwrap_err().to_string();
        assert!(e.contains("sm_90") && e.contains("sm_80"), "{k}: {e}");

        // The architecture-specific variant, for exactly an sm_90a device.
        let cubin_a = jit(&bc, "sm_90a", &[], &format!("{k}-sm90a"));
        let sm_a = cubin_sm(&cubin_a).unwrap();
        assert_eq!(sm_a.to_string(), "sm_90a", "{k}");
        sm_a.cubin_runs_on(h200).unwrap();
        assert!(sm_a.cubin_runs_on(Sm::device(10, 0)).is_err());

        // --emit-ptx writes the PTX before ptxas.
        let ptx = jit(&bc, "sm_90", &["--emit-ptx"], &format!("{k}-ptx"));
        assert!(
            matches!(offload_core::classify(&ptx).unwrap(), ImageKind::Ptx),
            "{k}"
        );
        assert_eq!(ptx_target(&ptx).unwrap().to_string(), "sm_90");
        let text = String::from_utf8_lossy(&ptx);
        assert!(
            text.contains(&format!(
                ".visible .entry {}(",
                if k == "atomics" { "histogram" } else { k }
            )),
            "{text}"
        );
    }
}

#[test]
fn ptxas_failures_reach_the_user_with_its_message() {
    use offload_core::jit::{CompileRequest, JitService, JitTarget, PostProcess};
    let client = offload_jit_client::JitClient::new(
        Ok(offload_jit_client::JitConfig {
            worker: Some(build_dir().join("offload-jit-worker")),
            ..Default::default()
        }),
        Vec::new(),
    );
    let bc = std::fs::read(nvptx_bitcode("saxpy", "sm_90")).unwrap();
    let ptxas = ptxas();
    // PTX for sm_90 assembled for an SM that does not exist.
    let e = client
        .compile(&CompileRequest {
            image: &bc,
            target: JitTarget {
                triple: NVPTX.into(),
                cpu: "sm_90".into(),
                features: String::new(),
            },
            post: PostProcess::Ptxas {
                path: ptxas.display().to_string(),
                version: "test".into(),
                arch: "sm_1".into(),
            },
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("ptxas") && e.contains("-arch=sm_1"), "{e}");
}

/// PTX for `sm`, assembled by the real ptxas for each of `archs`.
fn cubins(kernel: &str, sm: &str, archs: &[&str]) -> (Vec<u8>, Vec<Vec<u8>>) {
    let bc = nvptx_bitcode(kernel, sm);
    let ptx = jit(&bc, sm, &["--emit-ptx"], &format!("{kernel}-{sm}-ptx"));
    let out = archs
        .iter()
        .map(|arch| ptxas_cubin(&ptx, arch, &format!("{kernel}-{sm}")))
        .collect();
    (ptx, out)
}

#[test]
fn fatbins_give_each_device_its_best_entry() {
    let (ptx80, c) = cubins("saxpy", "sm_80", &["sm_80", "sm_86", "sm_90"]);
    let fat = fatbin::build(&[
        (EntryKind::Ptx, 80, &ptx80),
        (EntryKind::Cubin, 80, &c[0]),
        (EntryKind::Cubin, 86, &c[1]),
        (EntryKind::Cubin, 90, &c[2]),
    ]);
    let kind = offload_core::classify(&fat).unwrap();
    assert_eq!(kind, ImageKind::CudaFatbin);
    offload_cuda::check_native(&fat, &kind).unwrap();
    let entries = fatbin::entries(&fat).unwrap();
    assert_eq!(entries.len(), 4);
    let pick = |major, minor| fatbin::select(&entries, Sm::device(major, minor)).map(|e| e.label());
    assert_eq!(pick(9, 0).unwrap(), "cubin sm_90");
    assert_eq!(pick(8, 6).unwrap(), "cubin sm_86");
    assert_eq!(pick(8, 9).unwrap(), "cubin sm_86");
    assert_eq!(pick(8, 0).unwrap(), "cubin sm_80");
    assert_eq!(
        pick(10, 0).unwrap(),
        "PTX sm_80",
        "a newer device gets the PTX"
    );
    let e = pick(7, 5).unwrap_err().to_string();
    assert!(
        e.contains("4 entries") && e.contains("none runs on sm_75"),
        "{e}"
    );
    // The selected cubin is a real one for that SM.
    let chosen = fatbin::select(&entries, Sm::device(8, 6)).unwrap();
    assert_eq!(cubin_sm(chosen.payload).unwrap().to_string(), "sm_86");
}

fn cuda_info(envs: &[(&str, &str)]) -> serde_json::Value {
    let out = offload(&["info", "--json"], envs);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    plugin_json(&json, "cuda").clone()
}

fn has_cuda_device() -> Option<String> {
    let cuda = cuda_info(&[]);
    if cuda["status"] == "ok" {
        None
    } else {
        Some(cuda["reason"].as_str().unwrap_or("?").to_string())
    }
}

#[test]
fn without_a_driver_there_are_no_devices_and_runs_say_why() {
    // Not a pass where it cannot run: scripts/test.sh leaves it out on a machine with a CUDA
    // device and names it as skipped.
    assert!(
        has_cuda_device().is_some(),
        "this machine has a CUDA device: the no-driver path cannot be reached here"
    );
    let cuda = cuda_info(&[]);
    assert_eq!(cuda["status"], "no-devices", "{cuda}");
    let reason = cuda["reason"].as_str().unwrap();
    assert!(reason.contains("CUDA driver"), "{reason}");
    assert_eq!(cuda["devices"].as_array().unwrap().len(), 0);
    assert!(cuda["properties"]["ptxas"].is_string(), "{cuda}");
    // Every kind of CUDA image: exit 1, one line, saying there is no CUDA device and why.
    let dir = scratch("cuda-no-device");
    let bc = nvptx_bitcode("saxpy", "sm_90");
    let cubin = dir.join("saxpy.cubin");
    std::fs::write(&cubin, jit(&bc, "sm_90", &[], "nodev-cubin")).unwrap();
    let ptx = dir.join("saxpy.ptx");
    std::fs::write(&ptx, jit(&bc, "sm_90", &["--emit-ptx"], "nodev-ptx")).unwrap();
    let (ptx80, c) = cubins("saxpy", "sm_80", &["sm_80"]);
    let fat = dir.join("saxpy.fatbin");
    std::fs::write(
        &fat,
        fatbin::build(&[(EntryKind::Ptx, 80, &ptx80), (EntryKind::Cubin, 80, &c[0])]),
    )
    .unwrap();
    for image in [&bc, &cubin, &ptx, &fat] {
        let out = offload(&["run", image.to_str().unwrap(), "--kernel", "saxpy"], &[]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{}: {err}", image.display());
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains("no device")
                && err.contains("plugin 'cuda' can run this image")
                && err.contains("CUDA driver"),
            "{}: {err}",
            image.display()
        );
    }
}

/// A fake `libcuda.so.1` whose `cuInit` returns `init`, with `count` devices.
fn fake_driver(dir: &Path, name: &str, init: i32, count: i32, with_init: bool) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    let init_fn = if with_init {
        format!("int cuInit(unsigned f) {{ (void)f; return {init}; }}")
    } else {
        String::new()
    };
    std::fs::write(
        &src,
        format!(
            "{init_fn}
int cuDeviceGetCount(int *n) {{ *n = {count}; return 0; }}
int cuDriverGetVersion(int *v) {{ *v = 12080; return 0; }}
int cuGetErrorName(int e, const char **s) {{
  if (e == 34) {{ *s = \"CUDA_ERROR_STUB_LIBRARY\"; return 0; }}
  if (e == 100) {{ *s = \"CUDA_ERROR_NO_DEVICE\"; return 0; }}
  return 1;
}}
int cuGetErrorString(int e, const char **s) {{
  if (e == 34) {{ *s = \"CUDA driver is a stub library\"; return 0; }}
  return 1;
}}
"
        ),
    )
    .unwrap();
    let lib = dir.join(format!("{name}.so"));
    clang(&[
        "-shared",
        "-fPIC",
        src.to_str().unwrap(),
        "-o",
        lib.to_str().unwrap(),
    ]);
    lib
}

#[test]
fn stub_and_broken_drivers_are_reported_not_crashed_on() {
    let dir = scratch("cuda-fake-drivers");
    let cases: [(&str, i32, i32, bool, &str); 5] = [
        ("stub", 34, 1, true, "stub library"),
        ("nodevice", 100, 0, true, "reports no CUDA-capable device"),
        ("unknown-status", 999, 1, true, "CUDA error 999"),
        ("zero-devices", 0, 0, true, "reports no device"),
        ("no-cuinit", 0, 1, false, "has no cuInit"),
    ];
    for (name, init, count, with_init, want) in cases {
        let lib = fake_driver(&dir, name, init, count, with_init);
        let cuda = cuda_info(&[("OFFLOAD_CUDA_DRIVER", lib.to_str().unwrap())]);
        assert_eq!(cuda["status"], "no-devices", "{name}: {cuda}");
        let reason = cuda["reason"].as_str().unwrap();
        assert!(
            reason.contains(want),
            "{name}: '{reason}' should contain '{want}'"
        );
    }
    // A bad OFFLOAD_CUDA_DRIVER names the variable.
    let cuda = cuda_info(&[("OFFLOAD_CUDA_DRIVER", "/no such/libcuda.so.1")]);
    assert_eq!(cuda["status"], "failed", "{cuda}");
    assert!(
        cuda["reason"]
            .as_str()
            .unwrap()
            .contains("OFFLOAD_CUDA_DRIVER='/no such/libcuda.so.1'")
    );
}

#[test]
fn a_stub_on_the_loader_path_does_not_hide_the_driver() {
    // The loader path holds the toolkit's stub under one name and a driver (the fake, with
    // its devices) under the other: discovery takes the driver either way, as the real
    // `libcuda.so.1` beside a `stubs/libcuda.so` on LD_LIBRARY_PATH must be taken.
    let root = scratch("cuda-stub-order");
    let built = scratch("cuda-stub-order-src");
    let stub = fake_driver(&built, "stub", 34, 1, true);
    let not_a_driver = fake_driver(&built, "no-cuinit", 0, 1, false);
    let driver = fake_cuda_driver();
    for (case, stub_name) in [
        ("stub-unversioned", "libcuda.so"),
        ("stub-versioned", "libcuda.so.1"),
    ] {
        let dir = root.join(case);
        std::fs::create_dir_all(&dir).unwrap();
        let driver_name = if stub_name == "libcuda.so" {
            "libcuda.so.1"
        } else {
            "libcuda.so"
        };
        std::fs::copy(&stub, dir.join(stub_name)).unwrap();
        std::fs::copy(&driver, dir.join(driver_name)).unwrap();
        let cuda = cuda_info(&[("LD_LIBRARY_PATH", dir.to_str().unwrap())]);
        assert_eq!(cuda["status"], "ok", "{case}: {cuda}");
        assert!(
            cuda["devices"].as_array().is_some_and(|d| !d.is_empty()),
            "{case}: {cuda}"
        );
    }
    // Only the stub and a library without cuInit: no devices, and the reason names both.
    let dir = root.join("stub-only");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(&stub, dir.join("libcuda.so")).unwrap();
    std::fs::copy(&not_a_driver, dir.join("libcuda.so.1")).unwrap();
    let cuda = cuda_info(&[("LD_LIBRARY_PATH", dir.to_str().unwrap())]);
    assert_eq!(cuda["status"], "no-devices", "{cuda}");
    let reason = cuda["reason"].as_str().unwrap();
    assert!(
        reason.contains("'libcuda.so.1' has no cuInit")
            && reason.contains("'libcuda.so' is the CUDA toolkit's stub library"),
        "{reason}"
    );
}

/// With a GPU: every kernel from cubin, PTX, fatbin and bitcode, compared bit for bit with the
/// host plugin's results (the check `scripts/gpu-check.sh cuda` runs, here on images built now).
#[test]
#[ignore = "needs an NVIDIA GPU: scripts/test.sh runs it where `offload info` lists a CUDA device, scripts/gpu-check.sh cuda always"]
fn on_a_gpu_every_kernel_and_image_kind_matches_the_host() {
    if let Some(reason) = has_cuda_device() {
        panic!("this test needs a CUDA device: {reason}");
    }
    let cuda = cuda_info(&[]);
    let sm = cuda["devices"][0]["compute_unit"]
        .as_str()
        .unwrap()
        .to_string();
    let dir = scratch("cuda-gpu");
    cuda_check::prepare(&dir, &[&sm]).unwrap();
    // Bitcode is assembled by the ptxas on PATH (scripts/test.sh puts the one it installs
    // there), else compiled by the driver's JIT.
    let rt = offload::Runtime::with_plugin_dirs(&[build_dir()], None);
    if let Err(e) =
        cuda_check::run(&dir, &rt, &build_dir().join("offload")).and_then(|r| r.result())
    {
        panic!("{e}");
    }
}
