// printf and malloc in a target region (tests/tests/omptarget_gpu.rs): NVIDIA's go to CUDA's
// vprintf and malloc; AMD's printf needs LLVM's GPU C library and an RPC server, which the
// library reports as such.
#include <stdio.h>
#include <stdlib.h>

int main(void) {
  int x = 0;
#pragma omp target map(tofrom : x)
  {
    int *p = malloc(sizeof *p);
    *p = 3;
    printf("hello from the device %d\n", *p);
    x = *p;
    free(p);
  }
  printf("x %d\n", x);
  return 0;
}
