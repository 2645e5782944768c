#include "offload_kernel.h"

/* A kernel that needs many registers: HEAVY_WORDS words per work item stay live through every
 * round, so ptxas gives each thread about 130 registers (12.9, sm_90) and the kernel can run
 * fewer than 1024 threads per block: the CUDA GPU check launches it with 1024 (which must be
 * refused with the kernel's own limit) and at that limit (which must equal the host). Integer
 * arithmetic only, so every target computes the same bits. */
#define HEAVY_WORDS 48
OFFLOAD_KERNEL void heavy(int n, const unsigned *in, unsigned *out) {
  unsigned i = offload_global_id_x();
  if (i >= (unsigned)n)
    return;
  unsigned v[HEAVY_WORDS];
#pragma unroll
  for (unsigned k = 0; k < HEAVY_WORDS; k++)
    v[k] = in[(i + k) % (unsigned)n] ^ (k * 0x9e3779b9u);
  for (unsigned r = 0; r < 6; r++) {
#pragma unroll
    for (unsigned k = 0; k < HEAVY_WORDS; k++)
      v[k] = v[k] * 2654435761u + (v[(k + 37) % HEAVY_WORDS] >> 3) + r;
  }
  unsigned s = 0;
#pragma unroll
  for (unsigned k = 0; k < HEAVY_WORDS; k++)
    s = (s ^ v[k]) * 16777619u + k;
  out[i] = s;
}
OFFLOAD_SIGNATURE(heavy, int, const unsigned *, unsigned *);
OFFLOAD_PARAMS(heavy, int n, const unsigned in[n], unsigned out[n]);
