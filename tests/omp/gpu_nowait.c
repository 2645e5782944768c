// `nowait` target regions and data constructs on a GPU, for the drop-in libomptarget's tests
// on the fake CUDA driver (tests/tests/omptarget_gpu.rs) and for scripts/gpu-check.sh.
//
// rendezvous_regions: R independent `nowait` regions, then a taskwait. Their kernels are named
// after the function, and the fake driver makes a kernel whose name has "rendezvous" in it
// wait until FAKE_CUDA_RENDEZVOUS of them run at once: with one hidden helper thread
// (LIBOMP_NUM_HIDDEN_HELPER_THREADS=1) that only happens if each region's work is queued and
// the thread goes on to the next region's task while the first still runs.
//
// main's chain: enter data, a region and exit data, each `nowait` and ordered by `depend`:
// each task completes when its queued work has run, so the next starts after it.
//
// The fake does not compute: the program prints what it finds; on a GPU it checks it.
#include <omp.h>
#include <stdio.h>

#define N 4096
#define R 4
#define M 3000

static float x[R][N];
static float y[M];

void rendezvous_regions(void) {
  for (int r = 0; r < R; r++) {
    float *p = x[r];
#pragma omp target teams distribute parallel for nowait map(tofrom : p[0 : N]) firstprivate(r)
    for (int i = 0; i < N; i++)
      p[i] += (float)(r + 1);
  }
#pragma omp taskwait
}

int main(void) {
  for (int i = 0; i < M; i++)
    y[i] = i;
  rendezvous_regions();
#pragma omp target enter data map(to : y) nowait depend(out : y)
#pragma omp target teams distribute parallel for nowait depend(inout : y)
  for (int i = 0; i < M; i++)
    y[i] = 2 * y[i] + 1;
#pragma omp target exit data map(from : y) nowait depend(inout : y)
#pragma omp taskwait
  int ok = 1;
  for (int r = 0; r < R; r++)
    for (int i = 0; i < N; i++)
      ok &= x[r][i] == (float)(r + 1);
  for (int i = 0; i < M; i++)
    ok &= y[i] == 2.0f * i + 1;
  printf("nowait done devices %d %s\n", omp_get_num_devices(), ok ? "PASSED" : "WRONG");
  return 0;
}
