#include "offload_kernel.h"

/* Inclusive prefix sums within each block (Hillis-Steele), in dynamic shared memory of
 * 2 * B ints (B = block size): out[i] = in[b*B] + ... + in[i] for i in block b. */
OFFLOAD_KERNEL void block_scan(const int *in, int *out, int n) {
  int *buf = (int *)offload_shared_memory();
  unsigned t = offload_thread_id(0), B = offload_block_dim(0);
  unsigned i = offload_block_id(0) * B + t;
  unsigned out_half = 0; /* the half that holds the latest sums */
  buf[t] = i < (unsigned)n ? in[i] : 0;
  offload_barrier();
  for (unsigned off = 1; off < B; off <<= 1) {
    unsigned in_half = out_half;
    out_half = 1 - in_half;
    int v = buf[in_half * B + t];
    if (t >= off)
      v += buf[in_half * B + t - off];
    buf[out_half * B + t] = v;
    offload_barrier();
  }
  if (i < (unsigned)n)
    out[i] = buf[out_half * B + t];
}
OFFLOAD_SIGNATURE(block_scan, const int *, int *, int);
