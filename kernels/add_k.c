/* x[i] += k on x[0..n): the kernel of the seeded queue tests, which the fake drivers also run
 * (tests/fake-cuda, tests/fake-hsa), so queued work on them is checked by its results. */
#include "offload_kernel.h"

OFFLOAD_KERNEL void add_k(int n, unsigned k, unsigned *x) {
  unsigned i = offload_global_id_x();
  if (i < (unsigned)n)
    x[i] += k;
}
OFFLOAD_PARAMS(add_k, int n, unsigned k, unsigned x[n]);
