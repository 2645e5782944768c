// Output of target regions between the program's own: each line where it would be on a local
// device. Run on a remote device (tests/tests/mpi.rs), a region's printf is the proxy's, and
// must still come in this order: the program's line, the region's line, and so on; a burst of
// 40000 lines (3 MiB, more than a pipe or a stream's buffer holds); a `nowait` region before
// the line after its `taskwait`; a region's line the program finishes; two threads' regions,
// each region's line before the line its thread prints after it.
#include <omp.h>
#include <stdio.h>

int main(void) {
  int on_device = 0;
  for (int i = 0; i < 30; i++) {
    printf("host %d\n", i);
#pragma omp target map(tofrom : on_device)
    {
      on_device += !omp_is_initial_device();
      printf("region %d\n", i);
    }
  }
#pragma omp target
  {
    for (int j = 0; j < 40000; j++)
      printf("burst %05d .............................................................\n", j);
  }
  printf("host after burst\n");
#pragma omp target nowait
  { printf("nowait region\n"); }
#pragma omp taskwait
  printf("host after taskwait\n");
#pragma omp target
  { printf("part"); }
  printf("ial line\n");
#pragma omp parallel num_threads(2)
  {
    int t = omp_get_thread_num();
    for (int k = 0; k < 20; k++) {
#pragma omp target firstprivate(t, k)
      { printf("thread %d region %d\n", t, k); }
      printf("thread %d after region %d\n", t, k);
    }
  }
  printf("host end, %d of 30 regions on a device\n", on_device);
  return on_device == 30 ? 0 : 1;
}
