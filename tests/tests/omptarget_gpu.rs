//! The drop-in `libomptarget.so.19.1` on GPUs without a GPU: OpenMP programs that clang-19
//! builds for nvptx64 and amdgcn (`tests/omp/gpu_regions.c`, JIT mode, and AOT for amdgcn)
//! run against the fake CUDA driver and the fake HSA runtime, which log every launch. The
//! tests check LLVM 19's GPU kernel protocol at that boundary: the grid and block each
//! execution mode gets, the launch environment as the first argument (`~0`, or a block
//! pointing at the team reduction buffer sized from the kernel environment), the device
//! environment written before the first launch, dynamic shared memory, the JIT compiling once
//! for two devices of a kind, upstream's device numbering, and upstream's failure when no
//! device can run the image.
//!
//! The fakes do not compute: what the kernels produce (the program's `PASSED`), device
//! `malloc`, `printf`, reductions' results and the device runtime reading its environment are
//! checked only on a GPU, by `scripts/gpu-check.sh`.

use offload_tests::*;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Gpu {
    Nvidia,
    Amd,
}

impl Gpu {
    fn flags(self) -> [&'static str; 3] {
        match self {
            Gpu::Nvidia => [
                "-fopenmp-targets=nvptx64-nvidia-cuda",
                "--offload-arch=sm_90",
                "-nocudalib",
            ],
            Gpu::Amd => [
                "-fopenmp-targets=amdgcn-amd-amdhsa",
                "--offload-arch=gfx90a",
                "-nogpulib",
            ],
        }
    }
    fn tag(self) -> &'static str {
        match self {
            Gpu::Nvidia => "nvptx",
            Gpu::Amd => "amdgcn",
        }
    }
}

/// `tests/omp/gpu_regions.c` for `gpu`, linked against our library; JIT mode, or AOT with
/// LLVM's device runtime on the link line (clang links it into the device code).
fn build(gpu: Gpu, jit: bool) -> PathBuf {
    build_program("gpu_regions", gpu, jit)
}

/// `tests/omp/<name>.c`, as [`build`] builds it.
fn build_program(name: &str, gpu: Gpu, jit: bool) -> PathBuf {
    let lib = omptarget_dir();
    let out = scratch("omptarget-gpu").join(format!(
        "{name}-{}-{}",
        gpu.tag(),
        if jit { "jit" } else { "aot" }
    ));
    let src = repo_root().join(format!("tests/omp/{name}.c"));
    let mut args = vec!["-O2", "-fopenmp"];
    args.extend(gpu.flags());
    if jit {
        args.push("-fopenmp-target-jit");
    } else {
        args.push("/usr/lib/llvm-19/lib/libomptarget.devicertl.a");
    }
    let l = format!("-L{}", lib.display());
    let rpath = format!("-Wl,-rpath,{}", lib.display());
    args.extend([
        src.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        &l,
        &rpath,
    ]);
    clang(&args);
    out
}

/// Runs `program` on the fake of `gpu` (logging to `log`), with `envs`.
fn run(program: &Path, gpu: Gpu, log: &Path, envs: &[(&str, &str)]) -> Output {
    run_with(program, &[], gpu, log, envs)
}

/// [`run`] with arguments.
fn run_with(program: &Path, args: &[&str], gpu: Gpu, log: &Path, envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(program);
    cmd.args(args);
    for v in [
        "OMP_TARGET_OFFLOAD",
        "LIBOMPTARGET_INFO",
        "OFFLOAD_INFO",
        "LIBOMPTARGET_SHARED_MEMORY_SIZE",
    ] {
        cmd.env_remove(v);
    }
    match gpu {
        Gpu::Nvidia => cmd
            .env("OFFLOAD_CUDA_DRIVER", fake_cuda_driver())
            .env("FAKE_CUDA_LOG", log)
            .env("OFFLOAD_PTXAS", ptxas()),
        Gpu::Amd => cmd
            .env("OFFLOAD_HSA_RUNTIME", fake_hsa_runtime())
            .env("FAKE_HSA_LOG", log),
    };
    cmd.env("LIBOMPTARGET_INFO", "16");
    cmd.envs(envs.iter().copied());
    cmd.output().expect("run the OpenMP program")
}

/// One launch as the library announced it (`LIBOMPTARGET_INFO` 0x10).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Announced {
    kernel: String,
    blocks: u64,
    threads: u32,
    mode: String,
}

fn announced(stderr: &str) -> Vec<Announced> {
    stderr
        .lines()
        .filter_map(|l| {
            let rest = l.split("info: Launching kernel ").nth(1)?;
            let w: Vec<&str> = rest.split(' ').collect();
            // NAME with B blocks and T threads in MODE mode
            Some(Announced {
                kernel: w[0].to_string(),
                blocks: w[2].parse().ok()?,
                threads: w[5].parse().ok()?,
                mode: w[8].to_string(),
            })
        })
        .collect()
}

/// One launch as the fake saw it: kernel, blocks, threads per block, dynamic shared memory
/// (CUDA) or group segment (HSA), and the argument words.
#[derive(Debug, Clone)]
struct Seen {
    kernel: String,
    blocks: u64,
    threads: u64,
    shared: u64,
    args: Vec<u64>,
}

fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split(' ')
        .find_map(|w| w.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key} in {line}"))
}

fn first_dim(v: &str) -> u64 {
    v.split(',').next().unwrap().parse().unwrap()
}

fn le_words(hex: &str) -> Vec<u64> {
    (0..hex.len() / 16)
        .map(|i| {
            let b: Vec<u8> = (0..8)
                .map(|j| u8::from_str_radix(&hex[i * 16 + j * 2..i * 16 + j * 2 + 2], 16).unwrap())
                .collect();
            u64::from_le_bytes(b.try_into().unwrap())
        })
        .collect()
}

fn seen(gpu: Gpu, lines: &[String]) -> Vec<Seen> {
    lines
        .iter()
        .filter_map(|l| match gpu {
            Gpu::Nvidia => {
                let rest = l.strip_prefix("launch ")?;
                let params = field(l, "params=");
                Some(Seen {
                    kernel: rest.split(' ').next()?.to_string(),
                    blocks: first_dim(field(l, "grid=")),
                    threads: first_dim(field(l, "block=")),
                    shared: field(l, "shared=").parse().unwrap(),
                    args: params
                        .split(',')
                        .filter(|p| p.len() == 16)
                        .flat_map(le_words)
                        .collect(),
                })
            }
            Gpu::Amd => {
                let rest = l.strip_prefix("dispatch ")?;
                let wg = first_dim(field(l, "wg="));
                Some(Seen {
                    kernel: rest.split(' ').next()?.to_string(),
                    blocks: first_dim(field(l, "grid=")) / wg,
                    threads: wg,
                    shared: field(l, "group=").parse().unwrap(),
                    args: le_words(field(l, "kernarg=")),
                })
            }
        })
        .collect()
}

/// The device bitcode a JIT-mode program embeds, extracted with LLVM's own tools.
fn extract_bitcode(program: &Path, gpu: Gpu) -> PathBuf {
    let dir = scratch("omptarget-gpu");
    let pkg = dir.join(format!("{}.offloading", gpu.tag()));
    let bc = dir.join(format!("{}.bc", gpu.tag()));
    let ok = Command::new("llvm-objcopy-19")
        .arg(format!("--dump-section=.llvm.offloading={}", pkg.display()))
        .arg(program)
        .arg("/dev/null")
        .status()
        .unwrap()
        .success();
    assert!(ok, "llvm-objcopy-19 --dump-section .llvm.offloading");
    let arch = match gpu {
        Gpu::Nvidia => "sm_90",
        Gpu::Amd => "gfx90a",
    };
    let ok = Command::new("clang-offload-packager-19")
        .arg(&pkg)
        .arg(format!("--image=file={},arch={arch}", bc.display()))
        .status()
        .unwrap()
        .success();
    assert!(ok, "clang-offload-packager-19");
    bc
}

/// The kernel environments of the program's embedded bitcode (JIT mode): kernel name to
/// (ReductionDataSize, ReductionBufferLength).
fn reduction_sizes(program: &Path, gpu: Gpu) -> HashMap<String, (u64, u64)> {
    let bc = extract_bitcode(program, gpu);
    let ir = Command::new("llvm-dis-19")
        .arg(&bc)
        .arg("-o")
        .arg("-")
        .output()
        .unwrap();
    let ir = String::from_utf8_lossy(&ir.stdout).into_owned();
    let mut out = HashMap::new();
    for l in ir.lines() {
        let Some((name, rest)) = l.split_once("_kernel_environment = ") else {
            continue;
        };
        let name = name.trim_start_matches('@').to_string();
        // { { i8 a, i8 b, i8 mode, i32 min_t, i32 max_t, i32 min_teams, i32 max_teams,
        //     i32 reduction_data_size, i32 reduction_buffer_length }, ...
        let inner = rest.split("{ ").nth(2).expect("a configuration");
        let inner = inner.split('}').next().unwrap();
        let nums: Vec<i64> = inner
            .split(',')
            .map(|f| f.split_whitespace().last().unwrap().parse().unwrap())
            .collect();
        assert_eq!(nums.len(), 9, "{l}");
        out.insert(name, (nums[7] as u64, nums[8] as u64));
    }
    assert!(!out.is_empty(), "no kernel environment in\n{ir}");
    out
}

/// The fakes' contracts: nothing used without a context (CUDA), no copy outside an
/// allocation, no bad free, no queued work on freed memory.
fn assert_contracts_kept(lines: &[String], what: &str) {
    for bad in [
        "no-context",
        "wrong-context",
        "bad-free",
        "bad-copy",
        "use-after-free",
        "launch-refused",
    ] {
        let hits: Vec<&String> = lines.iter().filter(|l| l.starts_with(bad)).collect();
        assert!(hits.is_empty(), "{what}: {hits:?}");
    }
}

/// The launches upstream's plugins make of `gpu_regions.c` on the fake devices, by the
/// kernel's line (worked through LLVM 19's `getNumThreads` / `getNumBlocks`): the combined
/// loop of 1000 iterations gets 32 teams of 32 threads (too few iterations for the default
/// teams); num_teams(7) thread_limit(64) exactly that; the reduction loop like the first; the
/// generic `teams` region 3 teams of its 64 threads; the plain region one team of the default
/// threads (128 on NVIDIA, 256 on AMD).
fn expected(gpu: Gpu) -> Vec<(&'static str, u64, u32, &'static str)> {
    let plain = match gpu {
        Gpu::Nvidia => 128,
        Gpu::Amd => 256,
    };
    vec![
        ("_l24", 32, 32, "SPMD"),
        ("_l28", 7, 64, "SPMD"),
        ("_l33", 32, 32, "SPMD"),
        ("_l37", 3, 64, "Generic"),
        ("_l45", 1, plain, "Generic-SPMD"),
    ]
}

fn protocol(gpu: Gpu, jit: bool) {
    let program = build(gpu, jit);
    let log = fake_log("omptarget-gpu", &format!("{}-{jit}", gpu.tag()));
    let out = run(&program, gpu, &log, &[]);
    let (text, said) = (stdout(&out), stderr(&out));
    assert!(
        out.status.success() && text.starts_with("devices 1 initial 0 second -1 "),
        "{}: {:?}\n{text}\n{said}",
        gpu.tag(),
        out.status
    );
    let lines = log_lines(&log);
    assert_contracts_kept(&lines, gpu.tag());
    let ann = announced(&said);
    let got = seen(gpu, &lines);
    // What the library announced is what the driver got.
    assert_eq!(ann.len(), got.len(), "{said}\n{lines:#?}");
    for (a, s) in ann.iter().zip(&got) {
        assert_eq!(a.kernel, s.kernel);
        assert_eq!(
            (a.blocks, u64::from(a.threads)),
            (s.blocks, s.threads),
            "{a:?} {s:?}"
        );
    }
    // The teams, threads and mode of each region.
    let want = expected(gpu);
    assert_eq!(ann.len(), want.len(), "{ann:#?}");
    for (a, (line, blocks, threads, mode)) in ann.iter().zip(want) {
        assert!(
            a.kernel.ends_with(line),
            "{a:?} is not the region at {line}"
        );
        assert_eq!(
            (a.blocks, a.threads, a.mode.as_str()),
            (blocks, threads, mode),
            "{}",
            a.kernel
        );
    }
    // The device environment is written before the first launch.
    let first_launch = lines
        .iter()
        .position(|l| l.starts_with("launch ") || l.starts_with("dispatch "))
        .unwrap();
    let env = lines
        .iter()
        .position(|l| l == "global __omp_rtl_device_environment 48")
        .unwrap_or_else(|| panic!("no device environment lookup: {lines:#?}"));
    let write = match gpu {
        Gpu::Nvidia => "copy htod 48",
        Gpu::Amd => "copy 48",
    };
    assert!(env < first_launch && lines[env + 1] == write, "{lines:#?}");
    // The launch environment: `~0` but for the reduction kernel, whose block in device memory
    // points at a buffer of the kernel environment's size.
    let sizes = if jit {
        Some(reduction_sizes(&program, gpu))
    } else {
        None
    };
    for (i, s) in got.iter().enumerate() {
        let first = s.args[0];
        if !s.kernel.ends_with("_l33") {
            assert_eq!(first, u64::MAX, "{s:?}");
            continue;
        }
        assert_ne!(
            first,
            u64::MAX,
            "the reduction kernel has no launch environment"
        );
        // The allocations made since the previous launch: the 16-byte block, then the buffer.
        let at = lines
            .iter()
            .enumerate()
            .filter(|(_, l)| l.starts_with("launch ") || l.starts_with("dispatch "))
            .nth(i)
            .unwrap()
            .0;
        let allocs: Vec<(u64, u64)> = lines[..at]
            .iter()
            .rev()
            .take_while(|l| !l.starts_with("launch ") && !l.starts_with("dispatch "))
            .filter_map(|l| {
                let w: Vec<&str> = l.split(' ').collect();
                (w[0] == "alloc").then(|| {
                    (
                        u64::from_str_radix(w[2].trim_start_matches("0x"), 16).unwrap(),
                        w[3].parse().unwrap(),
                    )
                })
            })
            .collect();
        assert!(allocs.contains(&(first, 16)), "{first:#x} in {allocs:?}");
        if let Some(sizes) = &sizes {
            let (size, length) = sizes[&s.kernel];
            assert!(size > 0 && length > 0, "{sizes:?}");
            assert!(
                allocs.iter().any(|&(_, n)| n == size * length),
                "no {size} x {length} buffer in {allocs:?}"
            );
        }
    }
    // LIBOMPTARGET_SHARED_MEMORY_SIZE: every launch gets that much more dynamic shared memory.
    let log2 = fake_log("omptarget-gpu", &format!("{}-{jit}-shared", gpu.tag()));
    let out = run(
        &program,
        gpu,
        &log2,
        &[("LIBOMPTARGET_SHARED_MEMORY_SIZE", "512")],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let with = seen(gpu, &log_lines(&log2));
    assert_eq!(with.len(), got.len());
    for (a, b) in got.iter().zip(&with) {
        assert_eq!(b.shared, a.shared + 512, "{a:?} {b:?}");
    }
}

#[test]
fn nvptx_jit_programs_follow_llvm_19s_gpu_protocol_on_the_fake_cuda_driver() {
    protocol(Gpu::Nvidia, true);
}

#[test]
fn amdgcn_jit_programs_follow_llvm_19s_gpu_protocol_on_the_fake_hsa_runtime() {
    protocol(Gpu::Amd, true);
}

#[test]
fn amdgcn_aot_programs_follow_llvm_19s_gpu_protocol_on_the_fake_hsa_runtime() {
    protocol(Gpu::Amd, false);
}

/// Two devices of one kind: both are OpenMP devices (the GPU plugin's, numbered before the
/// host's, which has no image here), the bitcode is compiled once for both, and a second
/// process reads it from the disk cache.
#[test]
fn two_gpus_of_a_kind_compile_once_and_the_next_run_reads_the_disk_cache() {
    let program = build(Gpu::Nvidia, true);
    let cache = scratch("omptarget-gpu").join("jit-cache");
    let _ = std::fs::remove_dir_all(&cache);
    let envs = [
        ("FAKE_CUDA_DEVICES", "2"),
        ("OFFLOAD_CACHE", "1"),
        ("OFFLOAD_CACHE_DIR", cache.to_str().unwrap()),
        ("OFFLOAD_INFO", "jit"),
    ];
    let log = fake_log("omptarget-gpu", "two");
    let out = run(&program, Gpu::Nvidia, &log, &envs);
    let said = stderr(&out);
    assert!(
        out.status.success() && stdout(&out).starts_with("devices 2 initial 0 second 0 "),
        "{}\n{said}",
        stdout(&out)
    );
    assert_eq!(said.matches("compiled in").count(), 1, "{said}");
    let loads = log_lines(&log)
        .iter()
        .filter(|l| l.starts_with("load "))
        .count();
    assert_eq!(loads, 2, "one image per device");
    let out = run(&program, Gpu::Nvidia, &log, &envs);
    let said = stderr(&out);
    assert!(
        out.status.success()
            && said.contains("read from the disk cache")
            && !said.contains("compiled in"),
        "{said}"
    );
}

/// A code object for gfx90a on a gfx1100: the device does not take the image, so there is no
/// OpenMP device; by default the regions run on the host, and with mandatory offloading the
/// program stops with upstream's messages and says why.
#[test]
fn an_image_no_device_can_run_fails_as_upstream_fails_and_says_why() {
    let program = build(Gpu::Amd, false);
    let log = fake_log("omptarget-gpu", "wrong-gfx");
    let isa = ("FAKE_HSA_ISA", "amdgcn-amd-amdhsa--gfx1100");
    let out = run(&program, Gpu::Amd, &log, &[isa]);
    assert!(
        out.status.success() && stdout(&out).starts_with("devices 0 initial 1 "),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("not taken by device amdgpu:0")
            && stderr(&out).contains("gfx90a is not gfx1100"),
        "{}",
        stderr(&out)
    );
    let out = run(
        &program,
        Gpu::Amd,
        &log,
        &[isa, ("OMP_TARGET_OFFLOAD", "MANDATORY")],
    );
    let said = stderr(&out);
    assert!(
        !out.status.success()
            && said.contains(
                "omptarget error: No images found compatible with the installed hardware."
            )
            && said.contains("omptarget error: Not taken: device amdgpu:0")
            && said.contains(
                "omptarget fatal error 1: failure of target construct while offloading is mandatory"
            ),
        "{said}"
    );
}

/// Where the device code object embedded in `exe` lies (the second ELF in the file: the
/// program's own header comes first), by its section header table's end.
fn embedded_code_object(exe: &[u8]) -> std::ops::Range<usize> {
    let at = exe
        .windows(4)
        .skip(4)
        .position(|w| w == b"\x7fELF")
        .map(|p| p + 4)
        .expect("an embedded ELF");
    let o = &exe[at..];
    let shoff = u64::from_le_bytes(o[0x28..0x30].try_into().unwrap()) as usize;
    let shentsize = u16::from_le_bytes(o[0x3a..0x3c].try_into().unwrap()) as usize;
    let shnum = u16::from_le_bytes(o[0x3c..0x3e].try_into().unwrap()) as usize;
    at..at + shoff + shentsize * shnum
}

/// Seeded mutations of the AMD code object inside an AOT program (its kernel environments,
/// kernel descriptors, symbols and code): every mutant either runs, or its regions go to the
/// host because no device takes the image, or the library stops with upstream's fatal error.
/// Never a crash or a hang of the process.
#[test]
fn mutated_gpu_code_objects_fail_as_upstream_fails_never_worse() {
    use std::os::unix::process::ExitStatusExt;
    let program = build(Gpu::Amd, false);
    let exe = std::fs::read(&program).unwrap();
    let range = embedded_code_object(&exe);
    assert!(exe[range.start..].starts_with(b"\x7fELF\x02"), "{range:?}");
    let dir = scratch("omptarget-gpu");
    let mut rng = offload_core::rand::XorShift(0x6f6d_7067_7075);
    let (mut ran, mut host, mut stopped) = (0, 0, 0);
    for i in 0..24 {
        let mut m = exe.clone();
        for _ in 0..1 + rng.next_u64() % 6 {
            let at = range.start + (rng.next_u64() as usize) % range.len();
            m[at] ^= 1 << (rng.next_u64() % 8);
        }
        let p = dir.join(format!("mutant-{i}"));
        std::fs::write(&p, &m).unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let log = fake_log("omptarget-gpu", &format!("mutant-{i}"));
        let mut cmd = Command::new("timeout");
        cmd.arg("60").arg(&p);
        cmd.env("OFFLOAD_HSA_RUNTIME", fake_hsa_runtime())
            .env("FAKE_HSA_LOG", &log)
            .env("LIBOMPTARGET_INFO", "16")
            .env_remove("OMP_TARGET_OFFLOAD");
        let out = cmd.output().unwrap();
        let (text, said) = (stdout(&out), stderr(&out));
        match (out.status.code(), out.status.signal()) {
            (Some(0), _) if text.starts_with("devices 1 ") => ran += 1,
            (Some(0), _) if text.starts_with("devices 0 initial 1 ") => host += 1,
            (_, Some(libc::SIGABRT)) if said.contains("omptarget fatal error") => stopped += 1,
            other => panic!("mutant {i}: {other:?}\nstdout: {text}\nstderr: {said}"),
        }
    }
    println!(
        "24 mutants: {ran} ran, {host} taken by no device, {stopped} stopped by upstream's fatal error"
    );
    assert!(
        host + stopped > 0,
        "no mutant was refused: the mutations do nothing"
    );
}

/// `printf` in a target region: on NVIDIA the kernel is built and launched (CUDA's `vprintf`,
/// which only a GPU runs); on AMD the load fails with a message that says why (no GPU C
/// library and RPC server), and upstream's fatal error follows. Never a hang.
#[test]
fn printf_in_a_target_region_runs_on_nvidia_and_is_a_clear_error_on_amd() {
    let program = build_program("gpu_printf", Gpu::Nvidia, true);
    let log = fake_log("omptarget-gpu", "printf-nv");
    let out = run(&program, Gpu::Nvidia, &log, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        log_lines(&log).iter().any(|l| l.starts_with("launch ")),
        "{:?}",
        log_lines(&log)
    );
    let program = build_program("gpu_printf", Gpu::Amd, true);
    let log = fake_log("omptarget-gpu", "printf-amd");
    let out = run(&program, Gpu::Amd, &log, &[]);
    let said = stderr(&out);
    assert!(
        !out.status.success()
            && said.contains("undefined symbol: rpc_fprintf")
            && said.contains("an RPC server on the host, which offload does not provide")
            && said.contains(
                "omptarget fatal error 1: failure of target construct while offloading is mandatory"
            ),
        "{said}"
    );
}

/// An AOT image as the CUDA tests test cubins (NVIDIA AOT programs do not build here: no
/// `nvlink`): a cubin our JIT makes of the program's bitcode, registered through a descriptor
/// of its own (`tests/omp/register_image.c`) and run as a non-teams target region. On an sm_90
/// fake device it launches as upstream's plugin launches it (one team of 128 threads in
/// generic-SPMD mode, `~0` first, the device environment before); on an sm_80 the device does
/// not take it and says why, and the construct fails to the host as upstream's does.
#[test]
fn an_aot_cubin_runs_where_its_sm_allows_and_is_refused_elsewhere() {
    let program = build(Gpu::Nvidia, true);
    let dir = scratch("omptarget-gpu");
    let bc = extract_bitcode(&program, Gpu::Nvidia);
    let ir = Command::new("llvm-dis-19")
        .arg(&bc)
        .arg("-o")
        .arg("-")
        .output()
        .unwrap();
    let ir = String::from_utf8_lossy(&ir.stdout).into_owned();
    let kernel = ir
        .lines()
        .filter_map(|l| l.strip_prefix("define weak_odr protected void @"))
        .map(|l| l.split('(').next().unwrap().to_string())
        .find(|k| k.ends_with("_l45"))
        .expect("the plain target region's kernel");
    let cubin = dir.join("gpu_regions.cubin");
    let ptxas = ptxas();
    let out = offload(
        &[
            "jit",
            bc.to_str().unwrap(),
            "--target",
            "nvptx64-nvidia-cuda",
            "--cpu",
            "sm_90",
            "-o",
            cubin.to_str().unwrap(),
        ],
        &[("OFFLOAD_PTXAS", ptxas.to_str().unwrap())],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(&std::fs::read(&cubin).unwrap()[..4], b"\x7fELF");
    let driver = dir.join("register_image");
    let lib = omptarget_dir();
    clang(&[
        repo_root()
            .join("tests/omp/register_image.c")
            .to_str()
            .unwrap(),
        "-o",
        driver.to_str().unwrap(),
        &format!("-L{}", lib.display()),
        &format!("-Wl,-rpath,{}", lib.display()),
        "-lomptarget",
        "-fopenmp",
    ]);
    let log = fake_log("omptarget-gpu", "cubin");
    let out = run_with(
        &driver,
        &[cubin.to_str().unwrap(), &kernel],
        Gpu::Nvidia,
        &log,
        &[],
    );
    assert!(
        out.status.success() && stdout(&out) == "devices 1 rc 0\n",
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    let lines = log_lines(&log);
    assert_contracts_kept(&lines, "cubin");
    let launches: Vec<&String> = lines.iter().filter(|l| l.starts_with("launch ")).collect();
    assert_eq!(launches.len(), 1, "{lines:#?}");
    assert!(
        launches[0].starts_with(&format!("launch {kernel} grid=1,1,1 block=128,1,1 "))
            && launches[0].contains("params=ffffffffffffffff,"),
        "{}",
        launches[0]
    );
    let env = lines
        .iter()
        .position(|l| l == "global __omp_rtl_device_environment 48")
        .unwrap();
    let launch = lines.iter().position(|l| l.starts_with("launch ")).unwrap();
    assert!(
        env < launch && lines[env + 1] == "copy htod 48",
        "{lines:#?}"
    );
    // An sm_80: not taken, and why.
    let out = run_with(
        &driver,
        &[cubin.to_str().unwrap(), &kernel],
        Gpu::Nvidia,
        &log,
        &[("FAKE_CUDA_CC", "8.0")],
    );
    assert!(
        out.status.success() && stdout(&out) == "devices 0 rc -1\n",
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(
        stderr(&out)
            .lines()
            .any(|l| l.contains("not taken by device cuda:0")
                && l.contains("the cubin is for sm_90, this device is sm_80")),
        "{}",
        stderr(&out)
    );
}

/// `nowait` constructs on a GPU are queued, not run on the task's thread
/// (`tests/omp/gpu_nowait.c`): with one hidden helper thread, four `nowait` regions whose
/// kernels wait for each other in the fake driver (a rendezvous of four) all run at once, which
/// a synchronous construct cannot do (its helper thread would wait in the first launch until
/// the rendezvous times out); each task completes only when its queued work has run, so the
/// `depend` chain of enter data, region and exit data keeps its order at the driver: the copy
/// in, then the launch, then the copy back.
#[test]
fn nowait_regions_on_a_gpu_overlap_and_depend_chains_keep_their_order() {
    let program = build_program("gpu_nowait", Gpu::Nvidia, true);
    let log = fake_log("omptarget-gpu", "nowait");
    let out = run(
        &program,
        Gpu::Nvidia,
        &log,
        &[
            ("LIBOMP_NUM_HIDDEN_HELPER_THREADS", "1"),
            ("FAKE_CUDA_RENDEZVOUS", "4"),
        ],
    );
    let said = stderr(&out);
    assert!(out.status.success(), "{said}");
    assert!(
        stdout(&out).contains("nowait done devices 1"),
        "{}\n{said}",
        stdout(&out)
    );
    let lines = log_lines(&log);
    assert_contracts_kept(&lines, "nowait");
    let met: Vec<&String> = lines
        .iter()
        .filter(|l| l.starts_with("launch ") && l.contains("rendezvous_regions"))
        .collect();
    assert_eq!(met.len(), 4, "{lines:#?}");
    assert!(
        !lines.iter().any(|l| l == "rendezvous-timeout"),
        "the nowait regions did not run at once: {lines:#?}"
    );
    // The chain: y is 3000 floats (12000 bytes), which nothing else is.
    let at = |what: &dyn Fn(&String) -> bool| {
        lines
            .iter()
            .position(what)
            .unwrap_or_else(|| panic!("not in the log: {lines:#?}"))
    };
    let copy_in = at(&|l| l == "copy htod 12000");
    let launch = at(&|l| l.starts_with("launch ") && l.contains("_main_l"));
    let copy_out = at(&|l| l == "copy dtoh 12000");
    assert!(copy_in < launch && launch < copy_out, "{lines:#?}");

    // The same on the fake HSA runtime (its kernels do not wait for each other: the regions
    // complete, the chain keeps its order, no memory is freed under queued work).
    let program = build_program("gpu_nowait", Gpu::Amd, true);
    let log = fake_log("omptarget-gpu", "nowait-amd");
    let out = run(
        &program,
        Gpu::Amd,
        &log,
        &[("LIBOMP_NUM_HIDDEN_HELPER_THREADS", "1")],
    );
    let said = stderr(&out);
    assert!(
        out.status.success() && stdout(&out).contains("nowait done devices 1"),
        "{}\n{said}",
        stdout(&out)
    );
    let lines = log_lines(&log);
    assert_contracts_kept(&lines, "nowait on AMD");
    let dispatches = |what: &str| {
        lines
            .iter()
            .filter(|l| l.starts_with("dispatch ") && l.contains(what))
            .count()
    };
    assert_eq!(dispatches("rendezvous_regions"), 4, "{lines:#?}");
    assert_eq!(dispatches("_main_l"), 1, "{lines:#?}");
    let copies: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| *l == "copy 12000")
        .map(|(i, _)| i)
        .collect();
    let launch = lines
        .iter()
        .position(|l| l.starts_with("dispatch ") && l.contains("_main_l"))
        .expect("dispatched");
    assert!(
        copies.len() == 2 && copies[0] < launch && launch < copies[1],
        "{lines:#?}"
    );
}
