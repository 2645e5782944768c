#include "offload_kernel.h"

/* Records every ID of every work item of a 3-D launch: 12 unsigned per item, at the item's
 * linear index. */
OFFLOAD_KERNEL void ids(unsigned *out) {
  unsigned tpb = offload_block_dim(0) * offload_block_dim(1) * offload_block_dim(2);
  unsigned block = (offload_block_id(2) * offload_grid_dim(1) + offload_block_id(1)) *
                       offload_grid_dim(0) + offload_block_id(0);
  unsigned thread = (offload_thread_id(2) * offload_block_dim(1) + offload_thread_id(1)) *
                        offload_block_dim(0) + offload_thread_id(0);
  unsigned *o = out + 12u * (block * tpb + thread);
  for (int d = 0; d < 3; ++d) {
    o[d] = offload_thread_id(d);
    o[3 + d] = offload_block_id(d);
    o[6 + d] = offload_block_dim(d);
    o[9 + d] = offload_grid_dim(d);
  }
}
OFFLOAD_SIGNATURE(ids, unsigned *);
