#include "offload_kernel.h"

/* y[i] = a * x[i] + y[i] for i < n */
OFFLOAD_KERNEL void saxpy(int n, float a, const float *x, float *y) {
  unsigned i = offload_global_id_x();
  if (i < (unsigned)n)
    y[i] = a * x[i] + y[i];
}
OFFLOAD_SIGNATURE(saxpy, int, float, const float *, float *);
OFFLOAD_PARAMS(saxpy, int n, float a, const float x[n], float y[n]);
