/*
 * offload_kernel.h - write a kernel once, compile it for every offload backend.
 *
 *   clang-19 -O2 -fPIC -shared              k.c -o k.so      host CPU (x86-64, aarch64)
 *   clang-19 -O2 -target nvptx64-nvidia-cuda -march=sm_90   -S k.c -o k.ptx
 *   clang-19 -O2 -target amdgcn-amd-amdhsa -mcpu=gfx90a -nogpulib -c k.c -o k.o
 *   clang-15 -O2 -target spir64 -x cl -cl-std=CL2.0 -emit-llvm -c k.c -o k.bc
 *     && llvm-spirv-15 k.bc -o k.spv                        SPIR-V (Level Zero)
 *   (add -emit-llvm -c for bitcode the offload JIT compiles for the exact device)
 *
 * SPIR-V: the source is compiled as OpenCL C (`-x cl`; C has no kernel calling convention on
 * SPIR targets), and clang-19 writes spirv64 bitcode but no SPIR-V (Debian's LLVM 19 has no
 * SPIR-V target and no llvm-spirv of its version): Debian's clang-15 and llvm-spirv-15 make the
 * module (docs/level-zero.md). Kernel pointer parameters are OpenCL's `__global`: write them
 * with OFFLOAD_GLOBAL (`OFFLOAD_GLOBAL float *y`), which is nothing on the other targets.
 * OFFLOAD_SHARED arrays go inside the kernel's body there (OpenCL's rule for `__local`), and
 * dynamic shared memory is a `__local` pointer parameter whose size the launch passes (no
 * offload_shared_memory()).
 *
 * OFFLOAD_KERNEL marks an entry point: exported with default visibility on every target
 * (clang's amdgcn default is hidden, which would leave kernels LOCAL after linking) and with
 * the GPU kernel calling convention where there is one.
 *
 * offload_thread_id(d), offload_block_id(d), offload_block_dim(d), offload_grid_dim(d) are
 * CUDA's threadIdx, blockIdx, blockDim and gridDim for d = 0, 1, 2 (x, y, z); other d give 0.
 *
 * offload_barrier() waits until every work item of the block has reached it (CUDA's
 * __syncthreads); memory written before it by any work item of the block is visible to all
 * after it. Every work item of a block must reach the same barriers (as on a GPU).
 *
 * Block-shared memory: OFFLOAD_SHARED declares a static array shared by the work items of one
 * block (CUDA's __shared__), inside a kernel or at file scope:
 *     OFFLOAD_SHARED float tile[16][16];
 * offload_shared_memory() is the block's dynamic shared memory, sized by the launch
 * (`offload run --shared-mem BYTES`; CUDA's extern __shared__). Neither is initialised.
 *
 * Host execution model: a launch of grid G and block B runs the kernel once per work item
 * (G*B runs); the work items of a block run on one worker thread, blocks on many. Kernels
 * compiled by the offload JIT from bitcode become work-group functions (the work items of a
 * block as a loop the compiler can vectorise); native shared objects are called once per work
 * item. The IDs come from the worker's context, which the host plugin fills in and hands out
 * through a function pointer it sets when it loads the image; the layout below is a contract
 * with the host plugin. With barriers: from bitcode, the kernel is cut at its barriers into
 * regions, each a loop over the block's work items; in a native shared object, work item 0
 * runs on the worker's stack and, once it reaches a barrier, the others run as fibers that
 * switch at each barrier (correct, but 30-40 ns per work item per barrier: compile kernels
 * with barriers to bitcode for speed).
 */
#ifndef OFFLOAD_KERNEL_H
#define OFFLOAD_KERNEL_H

#ifdef __cplusplus
#define OFFLOAD_EXTERN_C extern "C"
#else
#define OFFLOAD_EXTERN_C
#endif

#if defined(__OPENCL_VERSION__) || defined(__OPENCL_C_VERSION__)
#define OFFLOAD_OPENCL 1
#endif

#if defined(OFFLOAD_OPENCL)

/* OpenCL C for SPIR / SPIR-V (Level Zero, OpenCL drivers): the work-item built-ins. */
#define OFFLOAD_KERNEL __kernel
#define OFFLOAD_DEVICE static inline
#define OFFLOAD_GLOBAL __global

OFFLOAD_DEVICE unsigned offload_thread_id(int d) {
  return (unsigned)d < 3u ? (unsigned)get_local_id((unsigned)d) : 0u;
}
OFFLOAD_DEVICE unsigned offload_block_id(int d) {
  return (unsigned)d < 3u ? (unsigned)get_group_id((unsigned)d) : 0u;
}
OFFLOAD_DEVICE unsigned offload_block_dim(int d) {
  return (unsigned)d < 3u ? (unsigned)get_local_size((unsigned)d) : 0u;
}
OFFLOAD_DEVICE unsigned offload_grid_dim(int d) {
  return (unsigned)d < 3u ? (unsigned)get_num_groups((unsigned)d) : 0u;
}
OFFLOAD_DEVICE void offload_barrier(void) { barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE); }
#define OFFLOAD_SHARED __local

#elif defined(__NVPTX__)

#define OFFLOAD_KERNEL OFFLOAD_EXTERN_C __attribute__((nvptx_kernel, visibility("default")))
#define OFFLOAD_DEVICE static inline __attribute__((always_inline))

OFFLOAD_DEVICE unsigned offload_thread_id(int d) {
  return d == 0 ? __nvvm_read_ptx_sreg_tid_x() : d == 1 ? __nvvm_read_ptx_sreg_tid_y()
         : d == 2 ? __nvvm_read_ptx_sreg_tid_z() : 0;
}
OFFLOAD_DEVICE unsigned offload_block_id(int d) {
  return d == 0 ? __nvvm_read_ptx_sreg_ctaid_x() : d == 1 ? __nvvm_read_ptx_sreg_ctaid_y()
         : d == 2 ? __nvvm_read_ptx_sreg_ctaid_z() : 0;
}
OFFLOAD_DEVICE unsigned offload_block_dim(int d) {
  return d == 0 ? __nvvm_read_ptx_sreg_ntid_x() : d == 1 ? __nvvm_read_ptx_sreg_ntid_y()
         : d == 2 ? __nvvm_read_ptx_sreg_ntid_z() : 0;
}
OFFLOAD_DEVICE unsigned offload_grid_dim(int d) {
  return d == 0 ? __nvvm_read_ptx_sreg_nctaid_x() : d == 1 ? __nvvm_read_ptx_sreg_nctaid_y()
         : d == 2 ? __nvvm_read_ptx_sreg_nctaid_z() : 0;
}
OFFLOAD_DEVICE void offload_barrier(void) { __syncthreads(); }
#define OFFLOAD_SHARED static __attribute__((address_space(3), loader_uninitialized))
extern __attribute__((address_space(3), aligned(16))) char __offload_dynamic_shared[];
OFFLOAD_DEVICE void *offload_shared_memory(void) { return (void *)__offload_dynamic_shared; }

#elif defined(__AMDGPU__)

#define OFFLOAD_KERNEL OFFLOAD_EXTERN_C __attribute__((amdgpu_kernel, visibility("default")))
#define OFFLOAD_DEVICE static inline __attribute__((always_inline))

OFFLOAD_DEVICE unsigned offload_thread_id(int d) {
  return d == 0 ? __builtin_amdgcn_workitem_id_x() : d == 1 ? __builtin_amdgcn_workitem_id_y()
         : d == 2 ? __builtin_amdgcn_workitem_id_z() : 0;
}
OFFLOAD_DEVICE unsigned offload_block_id(int d) {
  return d == 0 ? __builtin_amdgcn_workgroup_id_x() : d == 1 ? __builtin_amdgcn_workgroup_id_y()
         : d == 2 ? __builtin_amdgcn_workgroup_id_z() : 0;
}
OFFLOAD_DEVICE unsigned offload_block_dim(int d) {
  return d == 0 ? __builtin_amdgcn_workgroup_size_x() : d == 1 ? __builtin_amdgcn_workgroup_size_y()
         : d == 2 ? __builtin_amdgcn_workgroup_size_z() : 0;
}
OFFLOAD_DEVICE unsigned offload_grid_dim(int d) {
  /* The dispatch packet holds the grid in work items; CUDA's gridDim counts blocks. */
  unsigned items = d == 0 ? __builtin_amdgcn_grid_size_x() : d == 1 ? __builtin_amdgcn_grid_size_y()
                 : d == 2 ? __builtin_amdgcn_grid_size_z() : 0;
  unsigned block = offload_block_dim(d);
  return block ? (items + block - 1) / block : 0;
}
OFFLOAD_DEVICE void offload_barrier(void) {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}
#define OFFLOAD_SHARED static __attribute__((address_space(3), loader_uninitialized))
extern __attribute__((address_space(3), aligned(16))) char __offload_dynamic_shared[];
OFFLOAD_DEVICE void *offload_shared_memory(void) { return (void *)__offload_dynamic_shared; }

#else /* host CPU */

#define OFFLOAD_KERNEL OFFLOAD_EXTERN_C __attribute__((visibility("default")))
#define OFFLOAD_DEVICE static inline

/* The worker's current work item. This definition is the host plugin's contract (fields are
 * only ever added at the end): the plugin's C (crates/plugin-host-elf/cpp/exec.c) includes it
 * with OFFLOAD_HOST_CONTEXT_ONLY defined, its Rust mirror (HostContext in launch.rs) is tested
 * against that, and the JIT's work-group functions take the type from the image itself. */
typedef struct offload_host_context {
  unsigned thread_id[3];
  unsigned block_id[3];
  unsigned block_dim[3];
  unsigned grid_dim[3];
  void *shared;          /* the block's dynamic shared memory */
  unsigned shared_bytes; /* its size */
  unsigned reserved;
} offload_host_context;

#ifndef OFFLOAD_HOST_CONTEXT_ONLY

/* Set by the host plugin when it loads the image, to a function that returns the calling
 * worker thread's context. The context lives in the plugin, not in this image: thread-local
 * storage of a dlopen'ed image can move when other images are loaded and unloaded.
 * Weak so that every translation unit of a kernel library can include this header; protected
 * so that the image's own code always reads its own copy, even if the program or another
 * library exports a symbol of the same name. */
OFFLOAD_EXTERN_C __attribute__((weak, visibility("protected")))
const offload_host_context *(*__offload_host_context)(void);

OFFLOAD_DEVICE unsigned offload_thread_id(int d) {
  return (unsigned)d < 3u ? __offload_host_context()->thread_id[d] : 0u;
}
OFFLOAD_DEVICE unsigned offload_block_id(int d) {
  return (unsigned)d < 3u ? __offload_host_context()->block_id[d] : 0u;
}
OFFLOAD_DEVICE unsigned offload_block_dim(int d) {
  return (unsigned)d < 3u ? __offload_host_context()->block_dim[d] : 0u;
}
OFFLOAD_DEVICE unsigned offload_grid_dim(int d) {
  return (unsigned)d < 3u ? __offload_host_context()->grid_dim[d] : 0u;
}

/* Set by the host plugin when it loads the image, to its barrier (a switch to the block's next
 * work item). Weak and protected like the context. */
OFFLOAD_EXTERN_C __attribute__((weak, visibility("protected"))) void (*__offload_host_barrier)(void);

OFFLOAD_DEVICE void offload_barrier(void) { __offload_host_barrier(); }
OFFLOAD_DEVICE void *offload_shared_memory(void) { return __offload_host_context()->shared; }
/* Each worker thread runs one block at a time: its thread-local storage is the block's. */
#define OFFLOAD_SHARED static __thread

#endif /* OFFLOAD_HOST_CONTEXT_ONLY */
#endif

/* Pointer parameters of kernels: OpenCL's `__global` where that is needed, else nothing. */
#ifndef OFFLOAD_GLOBAL
#define OFFLOAD_GLOBAL
#endif

/* The host plugin's own C takes only the context type above. */
#ifndef OFFLOAD_HOST_CONTEXT_ONLY

/*
 * OFFLOAD_SIGNATURE(kernel, parameter types...) after a kernel records its parameter types in a
 * host image, so that the host plugin checks every launch against them (a u64 where the kernel
 * takes a pointer, a double where it takes a float, a missing argument: each refused with the
 * argument named). The types must be the kernel's own (checked at compile time):
 *
 *   OFFLOAD_KERNEL void saxpy(int n, float a, const float *x, float *y) { ... }
 *   OFFLOAD_SIGNATURE(saxpy, int, float, const float *, float *);
 *
 * OFFLOAD_SIGNATURE_NONE(kernel) for a kernel without parameters. Launches of host kernels
 * without a signature are not checked (GPU drivers and JIT-compiled images check theirs). Host C
 * only; on GPU targets and in C++ the macros declare nothing.
 */
#if !defined(__NVPTX__) && !defined(__AMDGPU__) && !defined(__cplusplus) &&                     \
    !defined(OFFLOAD_OPENCL)
/* 1 int/unsigned, 2 64-bit integer, 3 float, 4 double, 5 pointer, 6 anything else. */
#define OFFLOAD_ARG_CODE(T)                                                                      \
  _Generic((T)0, _Bool: 6, char: 6, signed char: 6, unsigned char: 6, short: 6,                  \
           unsigned short: 6, int: 1, unsigned int: 1, long: 2, unsigned long: 2, long long: 2, \
           unsigned long long: 2, float: 3, double: 4, long double: 6, default: 5)
#define OFFLOAD_NARGS_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16,    \
                       _17, _18, _19, _20, _21, _22, _23, _24, N, ...) N
#define OFFLOAD_NARGS(...)                                                                       \
  OFFLOAD_NARGS_(__VA_ARGS__, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, \
                 7, 6, 5, 4, 3, 2, 1, 0)
#define OFFLOAD_CAT_(a, b) a##b
#define OFFLOAD_CAT(a, b) OFFLOAD_CAT_(a, b)
#define OFFLOAD_CODES_1(a) OFFLOAD_ARG_CODE(a)
#define OFFLOAD_CODES_2(a, ...) OFFLOAD_ARG_CODE(a), OFFLOAD_CODES_1(__VA_ARGS__)
#define OFFLOAD_CODES_3(a, ...) OFFLOAD_ARG_CODE(a), OFFLOAD_CODES_2(__VA_ARGS__)
#define OFFLOAD_CODES_4(a, ...) OFFLOAD_ARG_CODE(a), OFFLOAD_CODES_3(__VA_ARGS__)
#define OFFLOAD_CODES_5(a, ...) OFFLOAD_ARG_CODE(a), OFFLOAD_CODES_4(__VA_ARGS__)
#define OFFLOAD_CODES_6(a, ...) OFFLOAD_ARG_CODE(a), OFFLOAD_CODES_5(__VA_ARGS__)
#define OFFLOAD_CODES_7(a, ...) OFFLOAD_ARG_CODE(a), OFFLOAD_CODES_6(__VA_ARGS__)
#define OFFLOAD_CODES_8(a, ...) OFFLOAD_ARG_CODE(a), OFFLOAD_CODES_7(__VA_ARGS__)
#define OFFLOAD_CODES_9(a, ...) OFFLOAD_ARG_CODE(a), OFFLOAD_CODES_8(__VA_ARGS__)
#define OFFLOAD_CODES_10(a, ...) OFFLOAD_ARG_CODE(a), OFFLOAD_CODES_9(__VA_ARGS__)
#define OFFLOAD_CODES_11(a, ...) OFFLOAD_ARG_CODE(a), OFFLOAD_CODES_10(__VA_ARGS__)
#define OFFLOAD_CODES_12(a, ...) OFFLOAD_ARG_CODE(a), OFFLOAD_CODES_11(__VA_ARGS__)
#define OFFLOAD_CODES_13(a, ...) OFFLOAD_ARG_CODE(a), OFFLOAD_CODES_12(__VA_ARGS__)
#define OFFLOAD_CODES_14(a, ...) OFFLOAD_ARG_CODE(a), OFFLOAD_CODES_13(__VA_ARGS__)
#define OFFLOAD_CODES_15(a, ...) OFFLOAD_ARG_CODE(a), OFFLOAD_CODES_14(__VA_ARGS__)
#define OFFLOAD_CODES_16(a, ...) OFFLOAD_ARG_CODE(a), OFFLOAD_CODES_15(__VA_ARGS__)
#define OFFLOAD_CODES_17(a, ...) OFFLOAD_ARG_CODE(a), OFFLOAD_CODES_16(__VA_ARGS__)
#define OFFLOAD_CODES_18(a, ...) OFFLOAD_ARG_CODE(a), OFFLOAD_CODES_17(__VA_ARGS__)
#define OFFLOAD_CODES_19(a, ...) OFFLOAD_ARG_CODE(a), OFFLOAD_CODES_18(__VA_ARGS__)
#define OFFLOAD_CODES_20(a, ...) OFFLOAD_ARG_CODE(a), OFFLOAD_CODES_19(__VA_ARGS__)
#define OFFLOAD_CODES_21(a, ...) OFFLOAD_ARG_CODE(a), OFFLOAD_CODES_20(__VA_ARGS__)
#define OFFLOAD_CODES_22(a, ...) OFFLOAD_ARG_CODE(a), OFFLOAD_CODES_21(__VA_ARGS__)
#define OFFLOAD_CODES_23(a, ...) OFFLOAD_ARG_CODE(a), OFFLOAD_CODES_22(__VA_ARGS__)
#define OFFLOAD_CODES_24(a, ...) OFFLOAD_ARG_CODE(a), OFFLOAD_CODES_23(__VA_ARGS__)
/* The record: version 1, the number of parameters, then one code per parameter. */
#define OFFLOAD_SIGNATURE(kernel, ...)                                                           \
  _Static_assert(__builtin_types_compatible_p(__typeof__(&kernel), void (*)(__VA_ARGS__)),      \
                 "OFFLOAD_SIGNATURE(" #kernel ", ...) does not match the kernel's parameters");  \
  __attribute__((used, visibility("default"))) const unsigned char                              \
      __offload_signature_##kernel[] = {1, OFFLOAD_NARGS(__VA_ARGS__),                           \
                                        OFFLOAD_CAT(OFFLOAD_CODES_, OFFLOAD_NARGS(__VA_ARGS__))( \
                                            __VA_ARGS__)}
#define OFFLOAD_SIGNATURE_NONE(kernel)                                                           \
  _Static_assert(__builtin_types_compatible_p(__typeof__(&kernel), void (*)(void)),             \
                 "OFFLOAD_SIGNATURE_NONE(" #kernel ") does not match the kernel's parameters");  \
  __attribute__((used, visibility("default"))) const unsigned char                              \
      __offload_signature_##kernel[] = {1, 0}
#else
#define OFFLOAD_SIGNATURE(kernel, ...) typedef int offload_signature_##kernel##_unused
#define OFFLOAD_SIGNATURE_NONE(kernel) typedef int offload_signature_##kernel##_unused
#endif

/*
 * OFFLOAD_PARAMS(kernel, parameter declarations...) after a kernel records its parameter list
 * with the extent of each pointer, written as C99 array parameters, in the image of every
 * target (host, NVPTX, AMDGPU, bitcode):
 *
 *   OFFLOAD_KERNEL void saxpy(int n, float a, const float *x, float *y) { ... }
 *   OFFLOAD_PARAMS(saxpy, int n, float a, const float x[n], float y[n]);
 *
 * The Rust API's checked launch (`Launch::run`) reads it: the type of each scalar, the element
 * type of each pointer, whether the kernel writes through it (not `const`) and how many
 * elements it may touch (`[n]`, `[nx * ny]`, `[2 * n + 1]`: integer literals and earlier
 * integer parameters with + - * and parentheses), and refuses a launch whose buffer is
 * shorter. The extents are the kernel author's promise: the kernel must not touch more. The
 * declarations must be the kernel's own (checked at compile time for the host; on NVPTX and
 * AMDGPU, whose kernels have their own calling convention, build the same source for the host
 * to check it).
 * OFFLOAD_PARAMS(kernel, void) for a kernel without parameters. C only.
 */
#if !defined(__cplusplus) && !defined(OFFLOAD_OPENCL)
#if defined(__NVPTX__) || defined(__AMDGPU__)
/* Kernels there have their own calling convention (and NVPTX no variable-length arrays): the
 * host build of the same source checks the record. */
#define OFFLOAD_PARAMS_CHECK_(kernel, ...) typedef int offload_params_##kernel##_unchecked
#else
#define OFFLOAD_PARAMS_CHECK_(kernel, ...)                                                       \
  _Static_assert(__builtin_types_compatible_p(__typeof__(&kernel), void (*)(__VA_ARGS__)),      \
                 "OFFLOAD_PARAMS(" #kernel ", ...) does not match the kernel's parameters")
#endif
#define OFFLOAD_PARAMS(kernel, ...)                                                              \
  OFFLOAD_PARAMS_CHECK_(kernel, __VA_ARGS__);                                                    \
  __attribute__((used, visibility("default"))) const char __offload_params_##kernel[] =         \
      #__VA_ARGS__
#else
#define OFFLOAD_PARAMS(kernel, ...) typedef int offload_params_##kernel##_unused
#endif

/* The global linear index along x, the most common kernel idiom. */
OFFLOAD_DEVICE unsigned offload_global_id_x(void) {
  return offload_block_id(0) * offload_block_dim(0) + offload_thread_id(0);
}

#endif /* OFFLOAD_HOST_CONTEXT_ONLY */
#endif /* OFFLOAD_KERNEL_H */
