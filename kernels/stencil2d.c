#include "offload_kernel.h"

/* 5-point Jacobi step on a width x height grid; border cells are copied unchanged. */
OFFLOAD_KERNEL void stencil2d(int width, int height, const float *in, float *out) {
  unsigned x = offload_block_id(0) * offload_block_dim(0) + offload_thread_id(0);
  unsigned y = offload_block_id(1) * offload_block_dim(1) + offload_thread_id(1);
  if (x >= (unsigned)width || y >= (unsigned)height)
    return;
  unsigned i = y * (unsigned)width + x;
  if (x == 0 || y == 0 || x == (unsigned)width - 1 || y == (unsigned)height - 1) {
    out[i] = in[i];
    return;
  }
  out[i] = 0.2f * (in[i] + in[i - 1] + in[i + 1] + in[i - width] + in[i + width]);
}
OFFLOAD_SIGNATURE(stencil2d, int, int, const float *, float *);
