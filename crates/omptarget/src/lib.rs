//! # omptarget: a drop-in `libomptarget.so.19.1`
//!
//! OpenMP offload programs built by clang-19 (`-fopenmp -fopenmp-targets=x86_64-pc-linux-gnu`)
//! depend on LLVM 19's `libomptarget.so.19.1` through C symbols of version `VERS1.0`. This crate
//! builds a library of that name and version node, so such programs run on offload's plugins
//! unchanged (`LD_LIBRARY_PATH=target/release`, or `-L target/release -Wl,-rpath,...` when
//! linking). It owns what is OpenMP's: registration, the OpenMP device numbering, the mapping
//! table with its reference counts ([`mapping`]), `omp_target_*`, the offload policy and host
//! fallback. It reaches devices only through the runtime library and the plugin ABI
//! ([`rtl`]). The reference for every behaviour is `reference/libomptarget-19.md` (LLVM 19.1.7).
//!
//! State of the work (see `docs/openmp.md`): registration, devices, the mapping algorithm
//! (reference counts, hold counts, PTR_AND_OBJ attach with shadow pointers, MEMBER_OF padding,
//! PRESENT, ALWAYS, DELETE, CLOSE, RETURN_PARAM, literal/private/firstprivate arguments,
//! mappers, non-contiguous updates, unified shared memory), target regions on the host plugin
//! from AOT images and from bitcode (`-fopenmp-target-jit`, compiled by the JIT worker), and on
//! the CUDA and AMD backends with LLVM 19's GPU kernel protocol ([`gpu`]: kernel environments,
//! teams and threads, launch and device environments, the AMD heap, init kernels), pooled
//! device memory ([`pool`]), the `omp_target_*` API (synchronous), the policy, upstream's
//! messages and info lines, OMPT's device-side callbacks ([`ompt`]), `nowait` constructs queued on
//! GPUs and completed through libomp's task handles ([`nowait`]). Not done: record-replay and
//! interop (upstream's failure codes); `nowait` work on the host plugin's devices runs
//! synchronously (in libomp's hidden helper task, which overlaps it with the program).

mod abi;
mod api;
mod gpu;
mod guard;
mod mapping;
mod messages;
mod nowait;
mod ompt;
mod pool;
mod rtl;
mod target;
