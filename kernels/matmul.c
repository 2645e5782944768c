#include "offload_kernel.h"

/* c = a * b for n x n row-major matrices, one work item per element of c (2-D launch), each
 * summing its products in k order. */
OFFLOAD_KERNEL void matmul(int n, const float *a, const float *b, float *c) {
  unsigned col = offload_block_id(0) * offload_block_dim(0) + offload_thread_id(0);
  unsigned row = offload_block_id(1) * offload_block_dim(1) + offload_thread_id(1);
  unsigned un = (unsigned)n;
  if (row >= un || col >= un)
    return;
  float acc = 0.0f;
  for (unsigned k = 0; k < un; ++k)
    acc += a[row * un + k] * b[k * un + col];
  c[row * un + col] = acc;
}
OFFLOAD_SIGNATURE(matmul, int, const float *, const float *, float *);
