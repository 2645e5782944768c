#include "offload_kernel.h"

/* y[i] = a * x[i] + y[i] */
OFFLOAD_KERNEL void saxpy(int n, float a, const float *x, float *y) {
  unsigned i = offload_global_id_x();
  if (i < (unsigned)n)
    y[i] = a * x[i] + y[i];
}
OFFLOAD_PARAMS(saxpy, int n, float a, const float x[n], float y[n]);

/* x[i] *= a */
OFFLOAD_KERNEL void scale(int n, float a, float *x) {
  unsigned i = offload_global_id_x();
  if (i < (unsigned)n)
    x[i] *= a;
}
OFFLOAD_PARAMS(scale, int n, float a, float x[n]);

/* y[i] += x[i] */
OFFLOAD_KERNEL void add(int n, const float *x, float *y) {
  unsigned i = offload_global_id_x();
  if (i < (unsigned)n)
    y[i] += x[i];
}
OFFLOAD_PARAMS(add, int n, const float x[n], float y[n]);

/* out[b] = the sum of in[2Bb .. 2Bb + 2B) (B = the block size, a power of two up to 1024):
 * a tree in block-shared memory, with a barrier after each step. */
OFFLOAD_KERNEL void block_sum(int n, int blocks, const unsigned *in, unsigned *out) {
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
  if (t == 0 && b < (unsigned)blocks)
    out[b] = partial[0];
}
OFFLOAD_PARAMS(block_sum, int n, int blocks, const unsigned in[n], unsigned out[blocks]);
