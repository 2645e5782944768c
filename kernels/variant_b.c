#include "offload_kernel.h"

/* Same kernel name as variant_a.c, different result: tells which image actually ran. */
OFFLOAD_KERNEL void which(unsigned *out) { out[offload_global_id_x()] = 0xBBBBu + offload_global_id_x(); }
