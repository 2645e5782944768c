//! Oracle tests (ARCHITECTURE.md decision 6): for the same input, CPU and optimisation level,
//! the engine's output (compiled in the JIT worker process, as every runtime compiles) equals
//! LLVM's own tools run as separate processes:
//! `opt-19 -O3 -mcpu=CPU | llc-19 -O3 -mcpu=CPU` (PTX text with `-asm-verbose=false`; AMDGPU and
//! x86-64 objects byte for byte).
//!
//! `opt` gets `-mcpu` too because the engine optimises for the device's CPU. For clang output
//! this changes nothing (its functions carry `target-cpu` attributes: the PTX and objects equal
//! plain `opt-19 -O3 | llc-19 -O3 -mcpu=CPU` as well); for hand-written IR without attributes,
//! a plain `opt -O3` optimises for a generic CPU and the x86-64 vectoriser chooses differently.
//!
//! Inputs: the kernels in `kernels/` compiled to bitcode by clang-19 for each target, and
//! hand-written IR in `tests/ir/`.

use offload_core::jit::{CompileRequest, JitService, JitTarget, PostProcess};
use offload_jit_client::{JitClient, JitConfig};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn scratch() -> PathBuf {
    let d = std::env::temp_dir().join(format!("offload-jit-oracle-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn run(cmd: &mut Command) -> Vec<u8> {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e} (run scripts/setup.sh)"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

struct Target {
    triple: &'static str,
    cpu: &'static str,
    clang: &'static [&'static str],
    llc: &'static [&'static str],
    ir: &'static str,
}

const TARGETS: [Target; 3] = [
    Target {
        triple: "nvptx64-nvidia-cuda",
        cpu: "sm_90",
        clang: &["-target", "nvptx64-nvidia-cuda", "-march=sm_90"],
        llc: &["-asm-verbose=false"],
        ir: "vector_add_nvptx.ll",
    },
    Target {
        triple: "amdgcn-amd-amdhsa",
        cpu: "gfx90a",
        clang: &["-target", "amdgcn-amd-amdhsa", "-mcpu=gfx90a", "-nogpulib"],
        llc: &["-filetype=obj"],
        ir: "reduce_loop_amdgcn.ll",
    },
    Target {
        triple: "x86_64-unknown-linux-gnu",
        cpu: "x86-64",
        clang: &["-target", "x86_64-unknown-linux-gnu", "-fPIC"],
        llc: &["-filetype=obj", "-relocation-model=pic"],
        ir: "dot_x86_64.ll",
    },
];

const KERNELS: [&str; 6] = ["saxpy", "stencil2d", "args16", "atomics", "ids", "empty"];

fn oracle(t: &Target, input: &Path) -> Vec<u8> {
    let mut opt = Command::new("opt-19")
        .args([
            "-O3",
            &format!("-mcpu={}", t.cpu),
            input.to_str().unwrap(),
            "-o",
            "-",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("opt-19 (run scripts/setup.sh)");
    let mut llc = Command::new("llc-19");
    llc.args(["-O3", &format!("-mcpu={}", t.cpu)])
        .args(t.llc)
        .args(["-", "-o", "-"])
        .stdin(opt.stdout.take().expect("piped stdout"));
    let out = run(&mut llc);
    let status = opt.wait().expect("opt-19 exit status");
    assert!(status.success(), "opt-19 failed on {}", input.display());
    out
}

fn inputs(t: &Target) -> Vec<PathBuf> {
    let dir = scratch();
    let mut v = Vec::new();
    for k in KERNELS {
        let out = dir.join(format!("{k}.{}.bc", t.cpu));
        let include = repo().join("include");
        let src = repo().join("kernels").join(format!("{k}.c"));
        run(Command::new("clang-19")
            .args(["-O2", "-emit-llvm", "-c", "-I", include.to_str().unwrap()])
            .args(t.clang)
            .args([src.to_str().unwrap(), "-o", out.to_str().unwrap()]));
        v.push(out);
    }
    v.push(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/ir")
            .join(t.ir),
    );
    v
}

#[test]
fn engine_output_equals_opt_and_llc() {
    let client = JitClient::new(
        Ok(JitConfig {
            worker: Some(env!("CARGO_BIN_EXE_offload-jit-worker").into()),
            ..JitConfig::default()
        }),
        Vec::new(),
    );
    for t in &TARGETS {
        let target = JitTarget {
            triple: t.triple.into(),
            cpu: t.cpu.into(),
            features: String::new(),
        };
        for input in inputs(t) {
            let bytes = std::fs::read(&input).unwrap();
            let ours = client
                .compile(&CompileRequest {
                    image: &bytes,
                    target: target.clone(),
                    post: PostProcess::Unchanged,
                })
                .unwrap();
            let theirs = oracle(t, &input);
            if ours.image.bytes != theirs {
                let dir = scratch();
                std::fs::write(dir.join("ours.out"), &ours.image.bytes).unwrap();
                std::fs::write(dir.join("theirs.out"), &theirs).unwrap();
                panic!(
                    "{} for {}: engine output ({} bytes) differs from opt|llc ({} bytes); both saved in {}",
                    input.display(),
                    t.cpu,
                    ours.image.bytes.len(),
                    theirs.len(),
                    dir.display()
                );
            }
            if t.triple.starts_with("nvptx") {
                let text = String::from_utf8_lossy(&ours.image.bytes);
                assert!(text.contains(".target sm_90"), "{text}");
            }
        }
    }
}
