#include "offload_kernel.h"

/* hist[in[i] % bins] += 1 for i < n, with relaxed atomic adds from every work item. */
OFFLOAD_KERNEL void hist(int n, int bins, const unsigned *in, unsigned *hist) {
  unsigned i = offload_global_id_x();
  if (i < (unsigned)n)
    __atomic_fetch_add(&hist[in[i] % (unsigned)bins], 1u, __ATOMIC_RELAXED);
}
OFFLOAD_SIGNATURE(hist, int, int, const unsigned *, unsigned *);
