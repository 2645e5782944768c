//! Oracle tests (`docs/decisions.md`, decision 6): for the same input, CPU and optimisation level,
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
//! Inputs: the kernels in `kernels/` compiled to bitcode by clang-19 for each target,
//! hand-written IR in `tests/ir/`, and generated modules with no top-level entity (comments
//! only, as three of LLVM's NVPTX CodeGen tests are), compiled for the target asked.

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

/// `opt | llc` of `input`, run in the input's directory with the file's own name: a module
/// that names no source file gets its file name as one (in an x86-64 object's `FILE` symbol),
/// as a module parsed by the engine gets the name `image`.
fn oracle(t: &Target, input: &Path) -> Vec<u8> {
    let mut opt = Command::new("opt-19")
        .current_dir(input.parent().unwrap())
        .args([
            "-O3",
            &format!("-mtriple={}", t.triple),
            &format!("-mcpu={}", t.cpu),
            input.file_name().unwrap().to_str().unwrap(),
            "-o",
            "-",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("opt-19 (run scripts/setup.sh)");
    let mut llc = Command::new("llc-19");
    llc.args([
        "-O3",
        &format!("-mtriple={}", t.triple),
        &format!("-mcpu={}", t.cpu),
    ])
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

/// Text with no top-level entity: `;` comments (any printable text, LLVM's `RUN:` lines among
/// them), blank lines, spaces and tabs, LF or CRLF line ends. Seeded and reproducible.
fn empty_module(seed: u64) -> String {
    let mut seq = offload_core::rand::XorShift(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut next = move |n: u64| seq.next_u64() % n;
    const WORDS: [&str; 10] = [
        "RUN:",
        "llc < %s -mtriple=nvptx64 -mcpu=sm_90",
        "| FileCheck %s",
        "CHECK: .version",
        "\u{e9}t\u{e9}",
        "define void @not_code()",
        "target triple = \"x\"",
        "\t",
        "%struct = type",
        "\u{1f600}",
    ];
    let eol = if next(4) == 0 { "\r\n" } else { "\n" };
    let mut text = String::new();
    let lines = 1 + next(12);
    for i in 0..lines {
        match next(4) {
            0 if i > 0 => text.push_str(["", " ", "\t  "][next(3) as usize]),
            _ => {
                text.push_str(&" ".repeat(next(3) as usize));
                text.push(';');
                for _ in 0..next(6) {
                    text.push(' ');
                    text.push_str(WORDS[next(WORDS.len() as u64) as usize]);
                }
            }
        }
        // The last line may end without a line feed.
        if i + 1 < lines || next(2) == 0 {
            text.push_str(eol);
        }
    }
    if !text.trim_start().starts_with(';') {
        text.insert_str(0, "; first\n");
    }
    text
}

/// A module with no top-level entity is valid IR: the engine compiles it for the target asked
/// and its output equals LLVM's tools' for the same text, on every target.
#[test]
fn modules_with_only_comments_compile_as_llc_compiles_them() {
    let client = JitClient::new(
        Ok(JitConfig {
            worker: Some(env!("CARGO_BIN_EXE_offload-jit-worker").into()),
            ..JitConfig::default()
        }),
        Vec::new(),
    );
    let dir = scratch();
    // The three files of LLVM 19's NVPTX CodeGen tests that hold only comments, in shape.
    let mut inputs = vec![
        "; Check that 'llc' does not crash if '-filetype=null' is used.\n\n; RUN: llc %s -filetype=null -march=nvptx -o -\n".to_string(),
        "; Check that all passes have names\n; RUN: llc %s -march=nvptx64 -O3 --debug-pass=Structure -o /dev/null 2>&1 | FileCheck %s\n; CHECK-NOT: Unnamed pass\n".to_string(),
        "; RUN: llc < %s -march=nvptx -mcpu=sm_20 | FileCheck %s --check-prefix=SM20\n\n; SM20: .version 3.2\n; SM20: .target sm_20\n".to_string(),
    ];
    inputs.extend((0..12).map(empty_module));
    for t in &TARGETS {
        let target = JitTarget {
            triple: t.triple.into(),
            cpu: t.cpu.into(),
            features: String::new(),
        };
        for (i, text) in inputs.iter().enumerate() {
            assert!(
                offload_core::image::is_empty_llvm_module(text.as_bytes()),
                "{text:?}"
            );
            // Named as the engine names the module it parses (see `oracle`).
            let path = dir.join(format!("empty{i}")).join("image");
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, text).unwrap();
            let ours = client
                .compile(&CompileRequest {
                    image: text.as_bytes(),
                    target: target.clone(),
                    post: PostProcess::Unchanged,
                })
                .unwrap_or_else(|e| panic!("{text:?} for {}: {e}", t.triple));
            let theirs = oracle(t, &path);
            assert!(
                ours.image.bytes == theirs,
                "{text:?} for {}: engine output ({} bytes) differs from opt|llc ({} bytes)",
                t.triple,
                ours.image.bytes.len(),
                theirs.len()
            );
            if t.triple.starts_with("nvptx") {
                let ptx = String::from_utf8_lossy(&ours.image.bytes);
                assert!(ptx.contains(".target sm_90"), "{ptx}");
            }
        }
    }
}
