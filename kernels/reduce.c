#include "offload_kernel.h"

/* out[b] = the sum of in[2Bb .. 2Bb + 2B) (B = block size, a power of two up to 1024), by a
 * tree in block-shared memory with a barrier after each step. Integer sums: exact everywhere. */
OFFLOAD_KERNEL void block_sum(const unsigned *in, unsigned *out, int n) {
  OFFLOAD_SHARED unsigned partial[1024];
  unsigned t = offload_thread_id(0), b = offload_block_id(0), B = offload_block_dim(0);
  unsigned i = b * B * 2 + t;
  unsigned v = 0;
  if (i < (unsigned)n)
    v += in[i];
  if (i + B < (unsigned)n)
    v += in[i + B];
  partial[t] = v;
  offload_barrier();
  for (unsigned s = B / 2; s > 0; s >>= 1) {
    if (t < s)
      partial[t] += partial[t + s];
    offload_barrier();
  }
  if (t == 0)
    out[b] = partial[0];
}
OFFLOAD_SIGNATURE(block_sum, const unsigned *, unsigned *, int);
