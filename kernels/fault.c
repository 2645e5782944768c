#include "offload_kernel.h"

/* Writes through a pointer nothing maps: the GPU checks' kernel that faults (a CUDA illegal
 * address, an AMD memory fault), run in a process of its own. */
OFFLOAD_KERNEL void fault(int n) {
  volatile unsigned *p = (volatile unsigned *)(unsigned long)(0x100000000000ul + (unsigned)n);
  *p = 1;
}
