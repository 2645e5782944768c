#include "offload_kernel.h"

#define TILE 16

/* c = a * b for n x n row-major matrices, with 16 x 16 tiles of a and b in block-shared memory
 * (launch with 16 x 16 blocks). Each element sums its products in k order. */
OFFLOAD_KERNEL void matmul_tiled(int n, const float *a, const float *b, float *c) {
  OFFLOAD_SHARED float ta[TILE][TILE];
  OFFLOAD_SHARED float tb[TILE][TILE];
  unsigned tx = offload_thread_id(0), ty = offload_thread_id(1);
  unsigned col = offload_block_id(0) * TILE + tx, row = offload_block_id(1) * TILE + ty;
  unsigned un = (unsigned)n;
  float acc = 0.0f;
  for (unsigned k0 = 0; k0 < un; k0 += TILE) {
    ta[ty][tx] = (row < un && k0 + tx < un) ? a[row * un + k0 + tx] : 0.0f;
    tb[ty][tx] = (col < un && k0 + ty < un) ? b[(k0 + ty) * un + col] : 0.0f;
    offload_barrier();
    for (unsigned k = 0; k < TILE; ++k)
      acc += ta[ty][k] * tb[k][tx];
    offload_barrier();
  }
  if (row < un && col < un)
    c[row * un + col] = acc;
}
OFFLOAD_SIGNATURE(matmul_tiled, int, const float *, const float *, float *);
