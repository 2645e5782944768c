#include "offload_kernel.h"

/* Histogram of (i * 7) % bins over n items with relaxed atomic adds from every block at once,
 * plus a global counter of the items seen. */
OFFLOAD_KERNEL void histogram(int n, int bins, unsigned *hist, unsigned long long *count) {
  unsigned i = offload_global_id_x();
  if (i >= (unsigned)n)
    return;
  __atomic_fetch_add(&hist[(i * 7u) % (unsigned)bins], 1u, __ATOMIC_RELAXED);
  __atomic_fetch_add(count, 1ull, __ATOMIC_RELAXED);
}
OFFLOAD_SIGNATURE(histogram, int, int, unsigned *, unsigned long long *);
