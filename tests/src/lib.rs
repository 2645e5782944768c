//! Helpers shared by the integration tests: where the built plugins and the `offload` binary
//! are, compiling the kernels in `kernels/` with clang-19, and synthetic ELF images.
//!
//! The tests expect `cargo build --workspace` (or `cargo test --workspace`) to have built the
//! plugins and the binary; a missing artefact fails with a message that says so.

pub mod gpu_check;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// Loads one of the suite's images ([`offload::Device::load_trusted`]): the suite's own kernels,
/// built from `kernels/` and the tests' sources, and images crafted to be refused.
pub fn load(device: &offload::Device, image: &[u8]) -> offload::Result<offload::Program> {
    // SAFETY: the suite trusts its own kernels, whose parameter records are written beside
    // their code; a crafted image is one the loader must refuse before any of its code runs,
    // and a test that got one loaded fails.
    unsafe { device.load_trusted(image) }
}

/// The `target/<profile>` directory this test binary was built into.
pub fn build_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let mut dir = exe.parent().expect("exe dir").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

fn require(path: PathBuf) -> PathBuf {
    assert!(
        path.exists(),
        "{} does not exist: run `cargo build --workspace{}` first (scripts/test.sh does)",
        path.display(),
        if build_dir().ends_with("release") {
            " --release"
        } else {
            ""
        }
    );
    path
}

/// The `offload` executable.
pub fn offload_bin() -> PathBuf {
    require(build_dir().join("offload"))
}

/// The directory holding `liboffload_plugin_host.so`.
pub fn host_plugin_dir() -> PathBuf {
    require(build_dir().join("liboffload_plugin_host.so"));
    build_dir()
}

/// A directory holding only the test backend, named as the runtime looks for plugins. Built
/// once per test process (in a directory of its own, so parallel test processes never see a
/// half-written file).
pub fn testdev_plugin_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let lib = require(build_dir().join("liboffload_testplugin_testdev.so"));
        let dir = build_dir().join(format!("testdev-plugin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(lib, dir.join("liboffload_plugin_testdev.so")).unwrap();
        dir
    })
    .clone()
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A scratch directory unique to this process and `tag`.
pub fn scratch(tag: &str) -> PathBuf {
    let dir = build_dir()
        .join("test-scratch")
        .join(format!("{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs clang-19 with `args`, panicking with its diagnostics on failure.
pub fn clang(args: &[&str]) {
    let out = Command::new("clang-19")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("clang-19 not runnable ({e}): run scripts/setup.sh"));
    assert!(
        out.status.success(),
        "clang-19 {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Compiles `kernels/<name>.c` for the host into a shared object (cached per process).
pub fn host_kernel(name: &str) -> PathBuf {
    let dir = scratch("kernels");
    let out = dir.join(format!("{name}.so"));
    if !out.exists() {
        let src = repo_root().join("kernels").join(format!("{name}.c"));
        let tmp = dir.join(format!("{name}.{:?}.tmp.so", std::thread::current().id()));
        let include = repo_root().join("include");
        clang(&[
            "-O2",
            "-fPIC",
            "-shared",
            "-ffp-contract=off",
            "-Wall",
            "-Werror",
            "-I",
            include.to_str().unwrap(),
            src.to_str().unwrap(),
            "-o",
            tmp.to_str().unwrap(),
        ]);
        std::fs::rename(&tmp, &out).unwrap();
    }
    out
}

/// Compiles a C source written here (with the kernel header) into a host shared object,
/// `<tag>.so` in this process's scratch directory.
pub fn host_so(tag: &str, source: &str) -> PathBuf {
    let dir = scratch("host-so");
    let src = dir.join(format!("{tag}.c"));
    let out = dir.join(format!("{tag}.so"));
    std::fs::write(&src, source).unwrap();
    let include = repo_root().join("include");
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
        out.to_str().unwrap(),
    ]);
    out
}

/// Builds the OpenMP program `src` (C, or C++ for `.cpp`) with clang-19 for x86-64
/// offloading at -O1 into `out`, linked against the libomptarget in `lib` with an rpath to it,
/// plus `extra` flags (`-fopenmp-target-jit` for JIT mode).
pub fn omp_program(src: &Path, out: &Path, lib: &Path, extra: &[&str]) {
    let mut args = vec![];
    if src.extension().is_some_and(|e| e == "cpp") {
        args.push("--driver-mode=g++");
    }
    args.extend([
        "-fopenmp",
        "-fopenmp-targets=x86_64-pc-linux-gnu",
        "-O1",
        src.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    let l = format!("-L{}", lib.display());
    let rpath = format!("-Wl,-rpath,{}", lib.display());
    args.extend([l.as_str(), rpath.as_str()]);
    args.extend(extra);
    clang(&args);
}

/// Runs the `offload` binary with only the host plugin directory on its search path (plus
/// `envs`).
pub fn offload(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(offload_bin());
    cmd.args(args)
        .env_remove("OFFLOAD_PLUGIN_PATH")
        .env_remove("OFFLOAD_PLUGINS");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().expect("run offload")
}

/// stdout as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// stderr as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A runtime that sees only the host plugin of this build.
pub fn host_runtime() -> offload::Runtime {
    offload::Runtime::with_plugin_dirs(&[host_plugin_dir()], Some(&["host".to_string()]))
}

/// Reads a raw little-endian file of `T`-sized elements.
pub fn read_f32s(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Little-endian bytes of a slice of `f32`.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A 64-bit little-endian ELF shared object for `machine` whose symbol table defines the given
/// functions (bodies are `ret`-sized placeholders; only the structure matters).
pub fn synthetic_elf(machine: u16, functions: &[&str]) -> Vec<u8> {
    use object::write::{Object, Symbol, SymbolSection};
    use object::{Architecture, BinaryFormat, Endianness, SymbolFlags, SymbolKind, SymbolScope};
    let mut obj = Object::new(BinaryFormat::Elf, Architecture::X86_64, Endianness::Little);
    let text = obj.section_id(object::write::StandardSection::Text);
    for (i, f) in functions.iter().enumerate() {
        let offset = obj.append_section_data(text, &[0xc3; 16], 16);
        assert_eq!(offset, 16 * i as u64);
        obj.add_symbol(Symbol {
            name: f.as_bytes().to_vec(),
            value: offset,
            size: 16,
            kind: SymbolKind::Text,
            scope: SymbolScope::Dynamic,
            weak: false,
            section: SymbolSection::Section(text),
            flags: SymbolFlags::None,
        });
    }
    let mut bytes = obj.write().unwrap();
    bytes[16..18].copy_from_slice(&3u16.to_le_bytes()); // ET_DYN
    bytes[18..20].copy_from_slice(&machine.to_le_bytes());
    bytes
}

/// Deterministic pseudo-random bytes (xorshift), for fuzz-like inputs.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut seq = offload_core::rand::XorShift(seed | 1);
    (0..len).map(|_| (seq.next_u64() >> 24) as u8).collect()
}

/// Compiles `kernels/<name>.c` for `target_args` into LLVM bitcode (`-emit-llvm -c`), or
/// textual IR when `ext` is `ll`; host bitcode is position independent, as it must be to link
/// into a shared object.
pub fn kernel_ir(name: &str, target_args: &[&str], ext: &str) -> PathBuf {
    let dir = scratch("kernel-ir");
    let tag = target_args.join("_").replace(['=', '-', ' '], "_");
    let out = dir.join(format!("{name}.{tag}.{ext}"));
    if !out.exists() {
        let src = repo_root().join("kernels").join(format!("{name}.c"));
        let include = repo_root().join("include");
        let tmp = dir.join(format!(
            "{name}.{tag}.{:?}.tmp",
            std::thread::current().id()
        ));
        let mut args = vec![
            "-O2",
            "-fPIC",
            "-ffp-contract=off",
            "-Wall",
            "-Werror",
            "-emit-llvm",
        ];
        args.push(if ext == "ll" { "-S" } else { "-c" });
        args.extend_from_slice(target_args);
        args.extend([
            "-I",
            include.to_str().unwrap(),
            src.to_str().unwrap(),
            "-o",
            tmp.to_str().unwrap(),
        ]);
        clang(&args);
        std::fs::rename(&tmp, &out).unwrap();
    }
    out
}

/// Host bitcode of `kernels/<name>.c`.
pub fn host_bitcode(name: &str) -> PathBuf {
    kernel_ir(name, &[], "bc")
}

/// Resident set size of this process in bytes (from /proc/self/statm).
pub fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    pages * page
}

/// `offload run IMAGE` of a `which` kernel (kernels/variant_*.c and the like) over 64 work items
/// (grid 2, block 32) writing into one 64-element `u32` buffer, argument 0.
pub fn which_run_args(image: &Path) -> Vec<String> {
    [
        "run",
        image.to_str().unwrap(),
        "--kernel",
        "which",
        "--grid",
        "2",
        "--block",
        "32",
        "--arg",
        "buf:u32:64",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// `offload run IMAGE --json` of kernels/saxpy.c's bitcode over 16384 elements (grid 64,
/// block 256): the JIT benches' fresh-process run.
pub fn saxpy_run_args(image: &Path) -> Vec<String> {
    [
        "run",
        image.to_str().unwrap(),
        "--kernel",
        "saxpy",
        "--grid",
        "64",
        "--block",
        "256",
        "--arg",
        "i32:16384",
        "--arg",
        "f32:2",
        "--arg",
        "buf:f32:16384:iota",
        "--arg",
        "buf:f32:16384:fill=1",
        "--json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Loads `image` on `device`, launches its `which` kernel (kernels/variant_*.c) over 64 work
/// items writing into `out`, unloads it, and returns what the kernel wrote.
pub fn run_which(device: &offload::Device, out: &offload::DeviceBuffer, image: &[u8]) -> Vec<u32> {
    use offload::{KernelArg, LaunchDims};
    let program = crate::load(device, image).unwrap();
    let k = program.kernel("which").unwrap();
    // SAFETY: the buffers are as long as the kernel touches for these arguments.
    unsafe {
        k.launch(LaunchDims::linear(2, 32))
            .args_raw(&[KernelArg::Ptr(out.ptr())])
            .unchecked()
            .run()
    }
    .unwrap();
    let mut raw = vec![0u8; 256];
    out.read(&mut raw).unwrap();
    raw.chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// The LLVM triple of CUDA devices.
pub const NVPTX: &str = "nvptx64-nvidia-cuda";

/// The `ptxas` the test command installs (scripts/setup.sh, from the PyPI wheel).
pub fn ptxas() -> PathBuf {
    let p = repo_root().join(".tools/cuda/nvidia/cuda_nvcc/bin/ptxas");
    assert!(
        p.exists(),
        "{} missing: run scripts/setup.sh (it installs ptxas from PyPI)",
        p.display()
    );
    p
}

/// nvptx64 bitcode of `kernels/<kernel>.c` for `sm`.
pub fn nvptx_bitcode(kernel: &str, sm: &str) -> PathBuf {
    kernel_ir(kernel, &["-target", NVPTX, &format!("-march={sm}")], "bc")
}

/// `offload jit` of `input` for nvptx64 `cpu` with the test's ptxas (a cubin; PTX with
/// `--emit-ptx` in `extra`); the output's bytes.
pub fn nvptx_jit(input: &Path, cpu: &str, extra: &[&str], tag: &str) -> Vec<u8> {
    let out = scratch("cuda-jit").join(format!("{tag}.out"));
    let mut args = vec![
        "jit",
        input.to_str().unwrap(),
        "--target",
        NVPTX,
        "--cpu",
        cpu,
        "-o",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let ptxas = ptxas();
    let o = offload(&args, &[("OFFLOAD_PTXAS", ptxas.to_str().unwrap())]);
    assert!(o.status.success(), "{tag}: {}", stderr(&o));
    std::fs::read(out).unwrap()
}

/// `ptxas -arch=<arch>` of PTX text: the cubin's bytes.
pub fn ptxas_cubin(ptx: &[u8], arch: &str, tag: &str) -> Vec<u8> {
    let dir = scratch("cuda-cubins");
    let input = dir.join(format!("{tag}.ptx"));
    let cubin = dir.join(format!("{tag}-{arch}.cubin"));
    std::fs::write(&input, ptx).unwrap();
    let out = Command::new(ptxas())
        .arg(format!("-arch={arch}"))
        .arg(&input)
        .arg("-o")
        .arg(&cubin)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ptxas -arch={arch}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read(cubin).unwrap()
}

/// The fake CUDA driver (`tests/fake-cuda/fake_cuda.c`: a driver without a GPU that checks
/// the driver's contracts and logs launches), built once per test process.
pub fn fake_cuda_driver() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| fake_library("fake-cuda/fake_cuda.c", "libcuda_fake.so", &[]))
        .clone()
}

/// A fake driver library: `tests/<source>` built by clang-19 into `<lib>` in this process's
/// scratch directory, warnings as errors, with `flags`.
fn fake_library(source: &str, lib: &str, flags: &[&str]) -> PathBuf {
    let src = repo_root().join("tests").join(source);
    let dir = source.split('/').next().unwrap_or("fake");
    let out = scratch(dir).join(lib);
    let mut args = vec!["-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-pthread"];
    args.extend_from_slice(flags);
    args.extend_from_slice(&[src.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    clang(&args);
    out
}

/// The entry of plugin `name` in `offload info --json` output.
pub fn plugin_json<'a>(info: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    info["plugins"]
        .as_array()
        .and_then(|a| a.iter().find(|p| p["name"] == name))
        .unwrap_or_else(|| panic!("plugin '{name}' is not in {info}"))
}

/// The LLVM triple of AMD GPUs.
pub const AMDGCN: &str = "amdgcn-amd-amdhsa";

/// amdgcn bitcode of `kernels/<kernel>.c` for `gfx` (a target id: `gfx90a`, `gfx90a:xnack+`).
pub fn amdgcn_bitcode(kernel: &str, gfx: &str) -> PathBuf {
    kernel_ir(
        kernel,
        &["-target", AMDGCN, &format!("-mcpu={gfx}"), "-nogpulib"],
        "bc",
    )
}

/// `offload jit` of `input` for amdgcn `cpu` (with `extra` options): the code object's bytes.
pub fn amdgcn_jit(input: &Path, cpu: &str, extra: &[&str], tag: &str) -> Vec<u8> {
    let out = scratch("amdgpu-jit").join(format!("{tag}.hsaco"));
    let mut args = vec![
        "jit",
        input.to_str().unwrap(),
        "--target",
        AMDGCN,
        "--cpu",
        cpu,
        "-o",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let o = offload(&args, &[]);
    assert!(o.status.success(), "{tag}: {}", stderr(&o));
    std::fs::read(out).unwrap()
}

/// The fake HSA runtime (`tests/fake-hsa/fake_hsa.c`: a runtime without a GPU that checks the
/// runtime's contracts and logs dispatches), built once per test process against the real ROCm
/// headers.
pub fn fake_hsa_runtime() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        fake_library(
            "fake-hsa/fake_hsa.c",
            "libhsa_fake.so",
            &["-I/usr/include/hsa"],
        )
    })
    .clone()
}

/// Random device-to-device copies inside one allocation of `device`, overlapping in both
/// directions (by distances from 1 byte, so both of the layer's ways to order them run) and
/// disjoint, synchronous and queued, each compared with `memmove` on a host copy of the
/// allocation. Panics naming the round that differs.
pub fn check_overlapping_device_copies(device: &offload::Device, seed: u64, rounds: usize) {
    use offload_core::{DevicePtr, MemoryKind};
    const SIZE: usize = 8192;
    // SAFETY: the device API on this function's own allocation only.
    let raw = unsafe { offload::raw::device(device) };
    let base = raw.alloc(SIZE as u64, MemoryKind::Device).unwrap();
    let queue = raw.queue_create().unwrap();
    let mut model = random_bytes(SIZE, seed);
    // SAFETY: `model` outlives the synchronous copy.
    unsafe { raw.copy_to_device(base, model.as_ptr(), SIZE, None) }.unwrap();
    let mut rng = offload_core::rand::XorShift(seed | 1);
    let mut back = vec![0u8; SIZE];
    for round in 0..rounds {
        let len = 1 + (rng.next_u64() % 3000) as usize;
        let src = (rng.next_u64() % (SIZE - len) as u64) as usize;
        let dst = match rng.next_u64() % 4 {
            // Overlapping, a small or a large distance, either direction.
            0 | 1 => {
                let d = 1
                    + (rng.next_u64()
                        % if rng.next_u64() % 2 == 0 {
                            16
                        } else {
                            len as u64
                        }) as usize;
                if rng.next_u64() % 2 == 0 {
                    src.saturating_sub(d)
                } else {
                    (src + d).min(SIZE - len)
                }
            }
            2 => src,
            _ => (rng.next_u64() % (SIZE - len) as u64) as usize,
        };
        let queued = rng.next_u64() % 3 == 0;
        // SAFETY: both ranges lie in this function's own allocation, which nothing else uses.
        unsafe {
            raw.copy_device_to_device(
                DevicePtr(base.0 + dst as u64),
                DevicePtr(base.0 + src as u64),
                len as u64,
                queued.then_some(queue),
            )
        }
        .unwrap();
        model.copy_within(src..src + len, dst);
        if round % 4 == 3 || round + 1 == rounds {
            raw.queue_synchronize(queue).unwrap();
            // SAFETY: `back` outlives the synchronous copy.
            unsafe { raw.copy_from_device(back.as_mut_ptr(), base, SIZE, None) }.unwrap();
            if let Some(i) = (0..SIZE).find(|&i| back[i] != model[i]) {
                panic!(
                    "round {round} (seed {seed:#x}): byte {i} is {:#04x}, memmove gives {:#04x} (last copy: {len} bytes from {src} to {dst}{})",
                    back[i],
                    model[i],
                    if queued { ", queued" } else { "" }
                );
            }
        }
    }
    raw.queue_destroy(queue).unwrap();
    // SAFETY: the allocation is this function's, and its queue is gone.
    unsafe { raw.free(base) }.unwrap();
}

/// Seeded random mixes of queued and synchronous work (copies in and out, device copies,
/// `add_k` launches, fills, scoped reads, events between queues) on buffers of `device` that
/// several threads share, each thread on its own range of every buffer, every read compared
/// with a model of what the host computes: no read sees memory from before work queued
/// earlier, no write is lost. `add` is kernels/add_k.c's `add_k` on `device`.
pub fn check_random_queued_work(device: &offload::Device, add: &offload::Kernel, seed: u64) {
    use offload::{DeviceBuffer, LaunchDims};
    use offload_core::rand::XorShift;
    const BUFFERS: usize = 3;
    const THREADS: usize = 3;
    const RANGE: usize = 512;
    let bufs: Vec<DeviceBuffer<u32>> = (0..BUFFERS)
        .map(|_| device.upload(&vec![0u32; RANGE * THREADS]).unwrap())
        .collect();
    let models: Vec<Vec<Vec<u32>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (device, bufs) = (&device, &bufs);
                s.spawn(move || {
                    let mut rng = XorShift(seed ^ 0x9e37_79b9 ^ (t as u64 * 0x1234_5678_9abc));
                    let mut model = vec![vec![0u32; RANGE]; BUFFERS];
                    let queues = [device.queue().unwrap(), device.queue().unwrap()];
                    let mut current = 0usize;
                    let base = t * RANGE;
                    for step in 0..200 {
                        let b = (rng.next_u64() % BUFFERS as u64) as usize;
                        let lo = (rng.next_u64() % RANGE as u64) as usize;
                        let len = 1 + (rng.next_u64() % (RANGE - lo) as u64) as usize;
                        let range = base + lo..base + lo + len;
                        let view = bufs[b].slice(range.clone()).unwrap();
                        let what = rng.next_u64() % 10;
                        // Queued work goes to one of two queues; moving to the other one is
                        // ordered by an event, as a program must.
                        if what >= 5 && rng.next_u64() % 4 == 0 {
                            let done = queues[current].record().unwrap();
                            current ^= 1;
                            queues[current].wait(&done).unwrap();
                        }
                        let q = &queues[current];
                        let ctx = format!("thread {t} step {step} op {what} buffer {b} {range:?}");
                        match what {
                            0 => {
                                let v: Vec<u32> = (0..len).map(|_| rng.next_u64() as u32).collect();
                                view.write(&v).unwrap();
                                model[b][lo..lo + len].copy_from_slice(&v);
                            }
                            1 | 2 => {
                                let mut got = vec![0u32; len];
                                view.read(&mut got).unwrap();
                                assert_eq!(got, model[b][lo..lo + len], "{ctx}: synchronous read");
                            }
                            3 => {
                                let v = rng.next_u64() as u32;
                                view.fill(v).unwrap();
                                model[b][lo..lo + len].fill(v);
                            }
                            4 => {
                                // Synchronous launch on this thread's range of a shared buffer.
                                let k = rng.next_u64() as u32 % 1000;
                                // SAFETY: add_k touches x[0..n) and the view holds n elements;
                                // no other thread uses this range.
                                unsafe {
                                    add.launch(LaunchDims::for_elems(len as u64, 64).unwrap())
                                        .arg(len as i32)
                                        .arg(k)
                                        .arg(view)
                                        .unchecked()
                                        .run()
                                }
                                .unwrap();
                                for v in &mut model[b][lo..lo + len] {
                                    *v = v.wrapping_add(k);
                                }
                            }
                            5 => {
                                let v: Vec<u32> = (0..len).map(|_| rng.next_u64() as u32).collect();
                                model[b][lo..lo + len].copy_from_slice(&v);
                                q.upload(view, v).unwrap();
                            }
                            6 => {
                                let k = rng.next_u64() as u32 % 1000;
                                let mut launch =
                                    add.launch(LaunchDims::for_elems(len as u64, 64).unwrap());
                                launch.arg(len as i32).arg(k).arg(view);
                                if add.params().is_some() {
                                    launch.on(q).run().unwrap();
                                } else {
                                    // An image without an OFFLOAD_PARAMS record (hand-written
                                    // SPIR-V). SAFETY: as for the synchronous launch above.
                                    unsafe { launch.on(q).unchecked().run() }.unwrap();
                                }
                                for v in &mut model[b][lo..lo + len] {
                                    *v = v.wrapping_add(k);
                                }
                            }
                            7 => {
                                // A queued device copy from another buffer's same range.
                                let from = (b + 1) % BUFFERS;
                                q.copy(view, bufs[from].slice(range.clone()).unwrap())
                                    .unwrap();
                                let src = model[from][lo..lo + len].to_vec();
                                model[b][lo..lo + len].copy_from_slice(&src);
                            }
                            8 => {
                                let mut got = vec![0u32; len];
                                q.scope(|s| s.read(&mut got, view)).unwrap();
                                assert_eq!(got, model[b][lo..lo + len], "{ctx}: queued read");
                            }
                            _ => {
                                // A synchronous device copy into this range.
                                let from = (b + 2) % BUFFERS;
                                view.copy_from(bufs[from].slice(range.clone()).unwrap())
                                    .unwrap();
                                let src = model[from][lo..lo + len].to_vec();
                                model[b][lo..lo + len].copy_from_slice(&src);
                            }
                        }
                    }
                    for q in &queues {
                        q.synchronize().unwrap();
                    }
                    model
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Nothing lost: every buffer is every thread's model, side by side.
    for (b, buf) in bufs.iter().enumerate() {
        let got = buf.to_vec().unwrap();
        for (t, model) in models.iter().enumerate() {
            assert_eq!(
                got[t * RANGE..(t + 1) * RANGE],
                model[b][..],
                "buffer {b}, thread {t}'s range at the end"
            );
        }
    }
}

/// What [`gpu_check_dry_run`] saw: the pipeline's status, its output and the JSON summary
/// (`Null` when none was written).
#[derive(Debug)]
pub struct DryRun {
    /// The status of `scripts/gpu-check.sh ... | tee`, with pipefail.
    pub status: std::process::ExitStatus,
    /// What the script printed.
    pub log: String,
    /// The check's summary.
    pub summary: serde_json::Value,
}

impl DryRun {
    /// The checks the summary says passed.
    pub fn passed(&self) -> Vec<&str> {
        self.summary["checks"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter(|c| c["status"] == "pass")
                    .filter_map(|c| c["check"].as_str())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// `scripts/gpu-check.sh BACKEND dry-run` into `dir` (plus `envs`), through a pipe as the
/// device tool runs it.
pub fn gpu_check_dry_run(backend: &str, dir: &Path, envs: &[(&str, &str)]) -> DryRun {
    let log = dir.join("gpu-check.log");
    let out = Command::new("bash")
        .args([
            "-o",
            "pipefail",
            "-c",
            &format!("scripts/gpu-check.sh {backend} dry-run 2>&1 | tee \"$LOG\""),
        ])
        .current_dir(repo_root())
        .env("LOG", &log)
        .env("OFFLOAD_GPU_CHECK_DRY_DIR", dir.join("run"))
        .envs(envs.iter().copied())
        .output()
        .unwrap();
    DryRun {
        status: out.status,
        log: std::fs::read_to_string(&log).unwrap_or_default(),
        summary: std::fs::read_to_string(dir.join("run/summary.json"))
            .ok()
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or(serde_json::Value::Null),
    }
}

/// The checks every backend's GPU check has beyond its kernels ([`gpu_check::run_extras`]).
pub const GPU_CHECK_EXTRAS: [&str; 6] = [
    "device copies, overlapping both ways (400 seeded)",
    "queued and synchronous work, 3 threads x 2 queues (seeded)",
    "events and their timing",
    "a global (the OFFLOAD_PARAMS record of add_k)",
    "host and shared memory as kernel arguments",
    "a kernel that faults (its own process)",
];

/// Runs `scripts/gpu-check.sh BACKEND dry-run` through a pipe and checks that it succeeds,
/// fails no check, calls itself a dry run and passes each of `wants`; when `failing` is given
/// (a fake's setting under which allocations fail), runs it once more with it and checks that
/// the run fails, its status coming through the pipe and its summary counting failures. The
/// first run.
/// The suite lines of a GPU check's dry run (`omp: suite ours: N passed, N failed, ...`): each
/// recorded test was replayed (ran, its result not judged: the fakes do not compute), none
/// missed its recorded program. Returns how many builds reported.
pub fn assert_suite_replayed(log: &str, tests: u64) -> usize {
    assert!(
        !log.contains("not built when the suite was prepared"),
        "a replay missed its recorded program:\n{log}"
    );
    let mut builds = 0;
    for line in log.lines().filter(|l| l.starts_with("omp: suite ours: ")) {
        // "omp: suite ours: 0 passed, 2 failed, 0 unsupported (...)"
        let counts = line.trim_start_matches("omp: suite ours: ");
        let n = |what: &str| -> u64 {
            counts
                .split(", ")
                .find_map(|part| part.strip_suffix(what)?.parse().ok())
                .unwrap_or(0)
        };
        assert_eq!(n(" passed") + n(" failed"), tests, "{line}");
        builds += 1;
    }
    assert!(builds > 0, "no suite lines:\n{log}");
    builds
}

pub fn assert_gpu_check_dry_run(
    backend: &str,
    wants: &[&str],
    failing: Option<(&str, &str)>,
) -> DryRun {
    let run = gpu_check_dry_run(backend, &scratch(&format!("gpu-check-dry-{backend}")), &[]);
    let summary = &run.summary;
    assert!(run.status.success(), "{}", run.log);
    assert_eq!(summary["failed"], 0, "{summary}");
    assert_eq!(summary["dry_run"], true, "{summary}");
    let passed = run.passed();
    for want in wants {
        assert!(passed.contains(want), "'{want}' did not pass: {summary}");
    }
    if let Some(setting) = failing {
        let bad = gpu_check_dry_run(
            backend,
            &scratch(&format!("gpu-check-dry-{backend}-failing")),
            &[setting],
        );
        assert!(!bad.status.success(), "{}", bad.log);
        assert!(
            bad.summary["failed"].as_u64().unwrap_or(0) > 0,
            "{}",
            bad.summary
        );
    }
    run
}

/// C `source` (against the kernel header) compiled by clang-19 -O2 for the host both ways: a
/// shared object (called once per work item) and bitcode (the JIT's work-group functions).
/// Returns their paths, `TAG.so` and `TAG.bc` in this process's scratch directory.
pub fn host_kernel_from_source(tag: &str, source: &str) -> (PathBuf, PathBuf) {
    let dir = scratch("host-src");
    let c = dir.join(format!("{tag}.c"));
    std::fs::write(&c, source).unwrap();
    let include = repo_root().join("include");
    let so = dir.join(format!("{tag}.so"));
    let bc = dir.join(format!("{tag}.bc"));
    clang(&[
        "-O2",
        "-fPIC",
        "-shared",
        "-I",
        include.to_str().unwrap(),
        c.to_str().unwrap(),
        "-o",
        so.to_str().unwrap(),
    ]);
    clang(&[
        "-O2",
        "-fPIC",
        "-emit-llvm",
        "-c",
        "-I",
        include.to_str().unwrap(),
        c.to_str().unwrap(),
        "-o",
        bc.to_str().unwrap(),
    ]);
    (so, bc)
}

/// `offload jit BC --target x86_64-unknown-linux-gnu --cpu CPU -o OUT` with `envs` and the
/// disk cache off (every call compiles); panics with the log when it fails. Returns the run
/// (its log on stderr).
pub fn host_jit(bc: &Path, cpu: &str, out: &Path, envs: &[(&str, &str)]) -> Output {
    let o = host_jit_run(bc, cpu, out, envs);
    assert!(
        o.status.success(),
        "offload jit {} failed:\n{}",
        bc.display(),
        stderr(&o)
    );
    o
}

/// [`host_jit`] that may fail: the run, whatever its status.
pub fn host_jit_run(bc: &Path, cpu: &str, out: &Path, envs: &[(&str, &str)]) -> Output {
    let mut all = vec![("OFFLOAD_CACHE", "0")];
    all.extend_from_slice(envs);
    offload(
        &[
            "jit",
            bc.to_str().unwrap(),
            "--target",
            "x86_64-unknown-linux-gnu",
            "--cpu",
            cpu,
            "-o",
            out.to_str().unwrap(),
        ],
        &all,
    )
}

/// The fake Level Zero driver (`tests/fake-level-zero/fake_ze.c`: a GPU driver without a GPU
/// that the real loader loads through `ZE_ENABLE_ALT_DRIVERS`), built once per test process
/// against Debian's Level Zero headers.
pub fn fake_ze_driver() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        fake_library(
            "fake-level-zero/fake_ze.c",
            "libze_fake.so",
            &["-fvisibility=hidden"],
        )
    })
    .clone()
}

/// A runtime in this process with only plugin `plugin` (from the build directory), after
/// `envs` are set in the environment (a fake driver's path, its log, its settings). The
/// environment must be set before anything reads it: call this first in a test, as nextest
/// runs each test in a process of its own.
pub fn runtime_with_env(plugin: &str, envs: &[(&str, &str)]) -> offload::Runtime {
    // SAFETY: no other thread of this process reads or writes the environment yet (see above).
    unsafe {
        for (k, v) in envs {
            std::env::set_var(k, v);
        }
    }
    offload::Runtime::with_plugin_dirs(&[build_dir()], Some(&[plugin.to_string()]))
}

/// A fake driver's log file for test `tag` (removed if a previous run left one), in this
/// process's scratch directory `dir`.
pub fn fake_log(dir: &str, tag: &str) -> PathBuf {
    let p = scratch(dir).join(format!("{tag}.log"));
    let _ = std::fs::remove_file(&p);
    p
}

/// The lines of a fake driver's log (none if it wrote nothing).
pub fn log_lines(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The build directory, with the drop-in library's versioned name beside it: the symlink
/// `libomptarget.so.19.1 -> libomptarget.so` that a program linked against it looks for (cargo
/// builds only `libomptarget.so`; the build script writes nothing outside its `OUT_DIR`). It
/// lives beside the library, not in a scratch directory, because the library finds its plugins
/// and JIT worker next to the path it was loaded by.
pub fn omptarget_dir() -> PathBuf {
    let dir = build_dir();
    let lib = dir.join("libomptarget.so");
    assert!(
        lib.exists(),
        "{} has no libomptarget.so: run cargo build --workspace",
        dir.display()
    );
    let link = dir.join("libomptarget.so.19.1");
    if std::fs::symlink_metadata(&link).is_err() {
        // Another test process may make it at the same moment: either link will do.
        let _ = std::os::unix::fs::symlink("libomptarget.so", &link);
    }
    assert!(link.exists(), "cannot make {}", link.display());
    dir
}

/// What a failing launch came to ([`fail_a_launch`]).
#[derive(Debug)]
pub struct LaunchFailure {
    /// The device address of the buffer the launch wrote, which the program drops just after.
    pub buffer: u64,
    /// What the queue's synchronize returned.
    pub error: offload::Error,
    /// What an allocation on the device came to after the buffer and the queue were dropped.
    pub alloc_after: offload::Result<()>,
}

/// Launches `add` (`kernels/add_k.c`: `x[i] += k` for `i < n`) of `program` over a buffer of
/// its own, on a queue of `device` (`queued`) or synchronously, on a fake driver set to fail
/// that launch; synchronizes the queue (which must fail), drops the buffer and the queue as a
/// program would, then allocates again. The caller reads the driver's log to see whether the
/// buffer was freed.
pub fn fail_a_launch(
    device: &offload::Device,
    add: &offload::Kernel,
    queued: bool,
) -> LaunchFailure {
    use offload::{KernelArg, LaunchDims};
    let n = 256usize;
    let x = device.upload(&vec![1u32; n]).unwrap();
    let queue = device.queue().unwrap();
    let args = [KernelArg::I32(n as i32), KernelArg::U32(2), x.arg()];
    let mut launch = add.launch(LaunchDims::linear(1, n as u32));
    if queued {
        launch.on(&queue);
    }
    // SAFETY: `x` holds the `n` elements add_k writes; the program drops it only after the
    // queue's synchronize has returned, and the layer keeps it while work that may use it
    // runs (which is what the callers check).
    let launched = unsafe { launch.args_raw(&args).unchecked().run() };
    let error = match launched.and_then(|()| queue.synchronize()) {
        Ok(()) => panic!("the fake driver was set to fail the launch of add_k (queued: {queued})"),
        Err(e) => e,
    };
    let buffer = x.ptr().0;
    drop(x);
    drop(queue);
    let alloc_after = device.alloc::<u32>(n).map(drop);
    LaunchFailure {
        buffer,
        error,
        alloc_after,
    }
}

/// How many lines of a fake driver's log free the allocation at `at` (`free ... 0x<at>`).
pub fn frees_of(lines: &[String], at: u64) -> usize {
    let at = format!(" {at:#x}");
    lines
        .iter()
        .filter(|l| l.starts_with("free ") && l.ends_with(&at))
        .count()
}

/// Where [`hung_read`] reads into, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HungRead {
    /// A `Vec`'s slice (pageable memory), synchronously.
    Pageable,
    /// A `Vec`'s slice, queued in a scope that lends it.
    PageableQueued,
    /// A [`offload::HostBuffer`] of the device (pinned memory), synchronously.
    Pinned,
    /// A [`offload::HostBuffer`] of the device, queued in a scope.
    PinnedQueued,
}

/// A read of 1000 `u32`s into memory the program has as a slice (`how`) on a fake driver set
/// to hang copies of 4000 bytes: it must return an unsettled error. Then the fake's `finish`
/// function (in library `fake`) makes the hung copy write, late, as an engine caught in a
/// fault may: it must miss the program's memory (the copy went to staging memory), and neither
/// its staging memory nor the device buffer it reads may have been freed (no "use-after-free",
/// no free of either in `log`); and the device is failed for good (an allocation after is
/// refused, saying so). Returns the read's error.
pub fn hung_read(
    device: &offload::Device,
    fake: &Path,
    finish: &str,
    how: HungRead,
    log: &Path,
) -> offload::Error {
    let n = 1000usize;
    let dbuf = device.upload(&vec![7u32; 2 * n]).unwrap();
    let mut vec = vec![0xabad_1deau32; n];
    // One element more than the read, so that no copy of the buffer's own is 4000 bytes.
    let mut pinned = device.alloc_host::<u32>(n + 1).unwrap();
    pinned.as_mut_slice().unwrap().fill(0xabad_1dea);
    let part = dbuf.slice(..n).unwrap();
    let (host, queued): (&mut [u32], bool) = match how {
        HungRead::Pageable => (&mut vec, false),
        HungRead::PageableQueued => (&mut vec, true),
        HungRead::Pinned => (&mut pinned.as_mut_slice().unwrap()[..n], false),
        HungRead::PinnedQueued => (&mut pinned.as_mut_slice().unwrap()[..n], true),
    };
    let at = host.as_ptr();
    let e = if queued {
        let queue = device.queue().unwrap();
        queue.scope(|s| s.read(host, part)).unwrap_err()
    } else {
        part.read(host).unwrap_err()
    };
    assert!(e.is_unsettled(), "{e:?}");
    drop(dbuf);
    // SAFETY: the fake driver the plugin has loaded (the same path, so the same library);
    // `finish` takes nothing and runs the copies it held.
    let finished = unsafe {
        let lib = libloading::Library::new(fake).unwrap();
        let finish = lib
            .get::<unsafe extern "C" fn() -> i32>(finish.as_bytes())
            .unwrap();
        finish()
    };
    assert_eq!(finished, 1);
    // SAFETY: `vec` is alive, and `pinned` is: the device, failed for good, frees nothing.
    let now = unsafe { std::slice::from_raw_parts(at, n) };
    assert!(
        now.iter().all(|&v| v == 0xabad_1dea),
        "the late copy wrote the program's memory ({how:?})"
    );
    let lines = log_lines(log);
    let hung: Vec<u64> = lines
        .iter()
        .find_map(|l| {
            let rest = l.strip_prefix("copy-hangs ")?;
            Some(
                rest.split(' ')
                    .take(2)
                    .map(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).unwrap())
                    .collect(),
            )
        })
        .unwrap_or_else(|| panic!("no copy hung: {lines:#?}"));
    let (staging, source) = (hung[0], hung[1]);
    assert_ne!(staging, at as u64);
    assert_eq!(frees_of(&lines, staging), 0, "{lines:#?}");
    assert_eq!(frees_of(&lines, source), 0, "{lines:#?}");
    let bad: Vec<&String> = lines
        .iter()
        .filter(|l| l.starts_with("use-after-free") || l.starts_with("bad-"))
        .collect();
    assert!(bad.is_empty(), "{bad:?}");
    let later = device.alloc::<u32>(4).map(drop).unwrap_err();
    assert!(
        later
            .to_string()
            .contains("failed for good by an operation that did not settle"),
        "{later}"
    );
    e
}

/// The checks of a [`LaunchFailure`]: an unsettled failure leaves the buffer unfreed for good
/// and the device failed, naming why; a settled one frees it once. No work ran on freed
/// memory either way.
pub fn assert_launch_failure(f: &LaunchFailure, unsettled: bool, lines: &[String]) {
    assert_eq!(f.error.is_unsettled(), unsettled, "{:?}", f.error);
    let hits: Vec<&String> = lines
        .iter()
        .filter(|l| l.starts_with("use-after-free"))
        .collect();
    assert!(hits.is_empty(), "{hits:?}");
    if unsettled {
        assert_eq!(
            frees_of(lines, f.buffer),
            0,
            "freed while unsettled: {lines:#?}"
        );
        let e = f.alloc_after.as_ref().unwrap_err().to_string();
        assert!(
            e.contains("failed for good") && e.contains("did not settle"),
            "{e}"
        );
    } else {
        assert_eq!(frees_of(lines, f.buffer), 1, "{lines:#?}");
        if let Err(e) = &f.alloc_after {
            assert!(!e.to_string().contains("failed for good"), "{e}");
        }
    }
}

/// SPIR-V assembly `text` assembled by `spirv-as` (SPIR-V 1.0) and checked by `spirv-val` for
/// OpenCL 2.0 unless `validate` is false; the module's bytes.
pub fn spirv_from_text(tag: &str, text: &str, validate: bool) -> Vec<u8> {
    let dir = scratch("spirv");
    let src = dir.join(format!("{tag}.spvasm"));
    let out = dir.join(format!("{tag}.spv"));
    std::fs::write(&src, text).unwrap();
    let o = Command::new("spirv-as")
        .args(["--target-env", "spv1.0"])
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .output()
        .expect("spirv-as (spirv-tools; scripts/setup.sh installs it)");
    assert!(
        o.status.success(),
        "spirv-as {tag}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    if validate {
        let v = Command::new("spirv-val")
            .args(["--target-env", "opencl2.0"])
            .arg(&out)
            .output()
            .unwrap();
        assert!(
            v.status.success(),
            "spirv-val {tag}: {}",
            String::from_utf8_lossy(&v.stderr)
        );
    }
    std::fs::read(out).unwrap()
}

/// `tests/spirv/<name>.spvasm`, assembled and validated.
pub fn spirv(name: &str) -> Vec<u8> {
    let text =
        std::fs::read_to_string(repo_root().join(format!("tests/spirv/{name}.spvasm"))).unwrap();
    spirv_from_text(name, &text, name != "compute")
}

/// A zebin as Intel's compiler lays one out (64-bit little-endian ELF, `EM_INTELGT`, `ET_REL`,
/// one `.text.<kernel>` section per kernel, a `.ze_info` section when `ze_info` is given);
/// each kernel is `(name, parameter count, mask of its __local parameters)`, the first words of
/// its section, which the fake Level Zero driver reads in place of real GPU code.
pub fn synthetic_zebin(kernels: &[(&str, u32, u32)], ze_info: Option<&str>) -> Vec<u8> {
    use object::write::Object;
    use object::{Architecture, BinaryFormat, Endianness, SectionKind};
    let mut obj = Object::new(BinaryFormat::Elf, Architecture::X86_64, Endianness::Little);
    for (name, args, locals) in kernels {
        let section = obj.add_section(
            Vec::new(),
            format!(".text.{name}").into_bytes(),
            SectionKind::Text,
        );
        let mut code = args.to_le_bytes().to_vec();
        code.extend_from_slice(&locals.to_le_bytes());
        code.extend_from_slice(&[0; 56]);
        obj.append_section_data(section, &code, 16);
    }
    if let Some(text) = ze_info {
        let section = obj.add_section(Vec::new(), b".ze_info".to_vec(), SectionKind::Other);
        obj.append_section_data(section, text.as_bytes(), 1);
    }
    let mut bytes = obj.write().unwrap();
    bytes[16..18].copy_from_slice(&1u16.to_le_bytes()); // ET_REL
    bytes[18..20].copy_from_slice(&offload_core::image::machine::INTELGT.to_le_bytes());
    bytes
}
/// `offload-test-loader` (tests/src/bin): loads images on the host device from threads and
/// prints what the JIT did, as JSON.
pub fn loader() -> PathBuf {
    build_dir().join("offload-test-loader")
}

/// The four images of the JIT cache tests: `which` kernels that write `BASE + work item` for four
/// different bases (four keys).
pub fn which_images() -> Vec<(PathBuf, &'static str)> {
    let dir = scratch("disk-cache-images");
    ["a000", "b000", "c000", "d000"]
        .into_iter()
        .map(|base| {
            let c = dir.join(format!("which_{base}.c"));
            let bc = dir.join(format!("which_{base}.bc"));
            if !bc.exists() {
                std::fs::write(
                    &c,
                    format!(
                        "#include \"offload_kernel.h\"\n\
                         OFFLOAD_KERNEL void which(unsigned *out) {{ \
                         out[offload_global_id_x()] = 0x{base}u + offload_global_id_x(); }}\n"
                    ),
                )
                .unwrap();
                let include = repo_root().join("include");
                clang(&[
                    "-O2",
                    "-fPIC",
                    "-emit-llvm",
                    "-c",
                    "-I",
                    include.to_str().unwrap(),
                    c.to_str().unwrap(),
                    "-o",
                    bc.to_str().unwrap(),
                ]);
            }
            (bc, base)
        })
        .collect()
}

/// `offload-test-loader` with `threads` threads over `images`, on the host plugin only.
pub fn run_loader(threads: usize, images: &[(PathBuf, &str)], env: &[(&str, String)]) -> Command {
    let mut cmd = Command::new(loader());
    cmd.arg(threads.to_string());
    for (p, v) in images {
        cmd.arg(format!("{}={v}", p.display()));
    }
    cmd.env_remove("OFFLOAD_PLUGIN_PATH")
        .env_remove("OFFLOAD_PLUGINS")
        .env("OFFLOAD_PLUGINS", "host");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// The loader's JSON (it must have succeeded).
pub fn loader_json(o: &Output) -> serde_json::Value {
    assert!(
        o.status.success(),
        "loader failed: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

/// `redis-server` or `redis-cli` (Debian's redis-server package; a missing one fails naming it).
pub fn redis_bin(name: &str) -> PathBuf {
    ["/usr/bin", "/usr/local/bin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!(
                "{name} (Debian's redis-server, which scripts/setup.sh installs) is not installed"
            )
        })
}

/// A `redis-server` of the test's own, ended (SIGKILL) when dropped.
#[derive(Debug)]
pub struct Redis {
    child: std::process::Child,
    /// Its directory (configuration, log, socket).
    pub dir: PathBuf,
    /// `redis+unix://…` or `rediss://…`.
    pub url: String,
    /// `redis-cli` arguments that reach it.
    pub cli: Vec<String>,
}

impl Redis {
    /// On a unix socket, with `conf` lines added to its configuration.
    pub fn start(tag: &str, conf: &[&str]) -> Redis {
        let dir = scratch("redis").join(tag);
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("redis.sock");
        let mut lines = vec![
            "port 0".to_string(),
            format!("unixsocket {}", sock.display()),
            "unixsocketperm 700".into(),
            format!("dir {}", dir.display()),
            "save \"\"".into(),
            "appendonly no".into(),
            "daemonize no".into(),
        ];
        lines.extend(conf.iter().map(|s| s.to_string()));
        let url = format!("redis+unix://{}", sock.display());
        let cli = vec!["-s".into(), sock.display().to_string()];
        let _ = std::fs::remove_file(&sock);
        Redis::run(dir, lines, url, cli)
    }

    /// On `127.0.0.1:port` (replication needs TCP), with `conf` lines added.
    pub fn start_tcp(tag: &str, port: u16, conf: &[&str]) -> Redis {
        let dir = scratch("redis").join(tag);
        std::fs::create_dir_all(&dir).unwrap();
        let mut lines = vec![
            format!("port {port}"),
            "bind 127.0.0.1".to_string(),
            format!("dir {}", dir.display()),
            "save \"\"".into(),
            "appendonly no".into(),
            "daemonize no".into(),
        ];
        lines.extend(conf.iter().map(|s| s.to_string()));
        let url = format!("redis://127.0.0.1:{port}");
        let cli = vec![
            "-h".into(),
            "127.0.0.1".into(),
            "-p".into(),
            port.to_string(),
        ];
        Redis::run(dir, lines, url, cli)
    }

    /// Kills the server now (SIGKILL).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the server of this configuration and waits until `redis-cli` reaches it.
    pub fn run(dir: PathBuf, lines: Vec<String>, url: String, cli: Vec<String>) -> Redis {
        let conf = dir.join("redis.conf");
        std::fs::write(&conf, lines.join("\n") + "\n").unwrap();
        let log = std::fs::File::create(dir.join("redis.log")).unwrap();
        let child = Command::new(redis_bin("redis-server"))
            .arg(&conf)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start redis-server");
        let r = Redis {
            child,
            dir,
            url,
            cli,
        };
        let started = std::time::Instant::now();
        while r.cli(&["PING"]).trim() != "PONG" {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(20),
                "redis-server did not start: {}",
                std::fs::read_to_string(r.dir.join("redis.log")).unwrap_or_default()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        r
    }

    /// `redis-cli` with these arguments: its output.
    pub fn cli(&self, args: &[&str]) -> String {
        let o = Command::new(redis_bin("redis-cli"))
            .args(&self.cli)
            .args(args)
            .output()
            .expect("run redis-cli");
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// The keys matching `pattern`, sorted.
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        let mut k: Vec<String> = self
            .cli(&["--scan", "--pattern", pattern])
            .lines()
            .map(str::to_string)
            .filter(|l| !l.is_empty())
            .collect();
        k.sort();
        k
    }

    /// Sends the server `sig`.
    pub fn signal(&self, sig: i32) {
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
