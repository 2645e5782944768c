/*
 * offload_kernel.h - write a kernel once, compile it for every offload backend.
 *
 *   clang-19 -O2 -fPIC -shared              k.c -o k.so      host CPU (x86-64, aarch64)
 *   clang-19 -O2 -target nvptx64-nvidia-cuda -march=sm_90   -S k.c -o k.ptx
 *   clang-19 -O2 -target amdgcn-amd-amdhsa -mcpu=gfx90a -nogpulib -c k.c -o k.o
 *   (add -emit-llvm -c for bitcode the offload JIT compiles for the exact device)
 *
 * OFFLOAD_KERNEL marks an entry point: exported with default visibility on every target
 * (clang's amdgcn default is hidden, which would leave kernels LOCAL after linking) and with
 * the GPU kernel calling convention where there is one.
 *
 * offload_thread_id(d), offload_block_id(d), offload_block_dim(d), offload_grid_dim(d) are
 * CUDA's threadIdx, blockIdx, blockDim and gridDim for d = 0, 1, 2 (x, y, z); other d give 0.
 *
 * Host execution model: a launch of grid G and block B calls the kernel once per work item
 * (G*B calls). The IDs come from the worker's context, which the host plugin fills in before
 * each call and hands out through a function pointer it sets when it loads the image; the
 * layout below is a contract with the host plugin. Kernels without barriers give the same
 * results as on a GPU.
 */
#ifndef OFFLOAD_KERNEL_H
#define OFFLOAD_KERNEL_H

#ifdef __cplusplus
#define OFFLOAD_EXTERN_C extern "C"
#else
#define OFFLOAD_EXTERN_C
#endif

#if defined(__NVPTX__)

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

#else /* host CPU */

#define OFFLOAD_KERNEL OFFLOAD_EXTERN_C __attribute__((visibility("default")))
#define OFFLOAD_DEVICE static inline

/* The worker's current work item; layout is part of the host plugin contract. */
typedef struct offload_host_context {
  unsigned thread_id[3];
  unsigned block_id[3];
  unsigned block_dim[3];
  unsigned grid_dim[3];
} offload_host_context;

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

#endif

/* The global linear index along x, the most common kernel idiom. */
OFFLOAD_DEVICE unsigned offload_global_id_x(void) {
  return offload_block_id(0) * offload_block_dim(0) + offload_thread_id(0);
}

#endif /* OFFLOAD_KERNEL_H */
