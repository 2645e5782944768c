#include "offload_kernel.h"

/* Does nothing: measures launch overhead. */
OFFLOAD_KERNEL void empty(void) {}
OFFLOAD_SIGNATURE_NONE(empty);
OFFLOAD_PARAMS(empty, void);
