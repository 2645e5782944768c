#include "offload_kernel.h"

/* A 7-point stencil on an nx x ny x nz grid of doubles: interior points become
 * 0.4 * centre + 0.1 * (the six neighbours), boundary points are copied. One work item per
 * point: x = thread, y = block y, z = block z (launch with grid (1, ny, nz), block (nx, 1, 1)). */
OFFLOAD_KERNEL void stencil7(int nx, int ny, int nz, const double *in, double *out) {
  unsigned x = offload_thread_id(0) + offload_block_id(0) * offload_block_dim(0);
  unsigned y = offload_block_id(1), z = offload_block_id(2);
  unsigned X = (unsigned)nx, Y = (unsigned)ny, Z = (unsigned)nz;
  if (x >= X || y >= Y || z >= Z)
    return;
  unsigned i = (z * Y + y) * X + x;
  if (x == 0 || y == 0 || z == 0 || x == X - 1 || y == Y - 1 || z == Z - 1) {
    out[i] = in[i];
    return;
  }
  out[i] = 0.4 * in[i] + 0.1 * (in[i - 1] + in[i + 1] + in[i - X] + in[i + X] + in[i - X * Y] +
                                in[i + X * Y]);
}
OFFLOAD_SIGNATURE(stencil7, int, int, int, const double *, double *);
