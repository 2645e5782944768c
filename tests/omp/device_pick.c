// A target region on the device argv[1] names, for the drop-in libomptarget tests
// (tests/tests/omptarget.rs): prints the number of devices and where the region ran.
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
  int dev = argc > 1 ? atoi(argv[1]) : 0, initial = -1;
  printf("devices %d\n", omp_get_num_devices());
  fflush(stdout);
#pragma omp target device(dev) map(from : initial)
  initial = omp_is_initial_device();
  printf("initial %d\n", initial);
  return 0;
}
