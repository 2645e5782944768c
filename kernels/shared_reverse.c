#include "offload_kernel.h"

/* Each block reverses its slice of `per_block` words through dynamic shared memory of
 * per_block * 4 bytes (offload_shared_memory()): out[b*P + j] = in[b*P + P-1-j]. With
 * P = 16384 the block uses 64 KiB, more than a CUDA kernel gets without opting in. */
OFFLOAD_KERNEL void shared_reverse(const unsigned *in, unsigned *out, int per_block) {
  unsigned *buf = (unsigned *)offload_shared_memory();
  unsigned t = offload_thread_id(0), B = offload_block_dim(0), b = offload_block_id(0);
  unsigned p = (unsigned)per_block;
  for (unsigned j = t; j < p; j += B)
    buf[j] = in[b * p + j];
  offload_barrier();
  for (unsigned j = t; j < p; j += B)
    out[b * p + j] = buf[p - 1 - j];
}
OFFLOAD_SIGNATURE(shared_reverse, const unsigned *, unsigned *, int);
