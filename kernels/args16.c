#include "offload_kernel.h"

/* 16 arguments of mixed types, more than fit in registers on x86-64 or aarch64, so some
 * integers and floats travel on the stack. Each work item i writes
 * out[i] = i * (a0 + ... ) combining every argument, so a swapped or truncated argument shows. */
OFFLOAD_KERNEL void args16(int a0, long long a1, float a2, double a3, int a4, float a5,
                           double a6, long long a7, float a8, double a9, int a10, double a11,
                           float a12, long long a13, double *out, int n) {
  unsigned i = offload_global_id_x();
  if (i >= (unsigned)n)
    return;
  double s = (double)a0 + (double)a1 * 2.0 + (double)a2 * 3.0 + a3 * 4.0 + (double)a4 * 5.0 +
             (double)a5 * 6.0 + a6 * 7.0 + (double)a7 * 8.0 + (double)a8 * 9.0 + a9 * 10.0 +
             (double)a10 * 11.0 + a11 * 12.0 + (double)a12 * 13.0 + (double)a13 * 14.0;
  out[i] = s * (double)(i + 1);
}
OFFLOAD_SIGNATURE(args16, int, long long, float, double, int, float, double, long long, float,
                  double, int, double, float, long long, double *, int);
