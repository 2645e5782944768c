// Target regions of each kind LLVM 19's GPU protocol distinguishes, for the protocol tests of
// the drop-in libomptarget on the fake CUDA driver and the fake HSA runtime
// (tests/tests/omptarget_gpu.rs). The fakes do not run kernels, so the program prints what it
// finds without judging it; on a GPU (scripts/gpu-check.sh) it checks its results.
#include <omp.h>
#include <stdio.h>

#define N 1000

int counter[4];
#pragma omp declare target(counter)

// Keeps the team's serial part serial (an opaque call), so the region stays in generic mode.
__attribute__((noinline)) void note(int *p, int v) { __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
#pragma omp declare target(note)

int main(void) {
  static float a[N], b[N];
  for (int i = 0; i < N; i++) {
    a[i] = i;
    b[i] = 1;
  }
  // SPMD: a combined construct with a trip count.
#pragma omp target teams distribute parallel for map(to : a) map(tofrom : b)
  for (int i = 0; i < N; i++)
    b[i] += 2 * a[i];
  // num_teams and thread_limit.
#pragma omp target teams distribute parallel for num_teams(7) thread_limit(64) map(tofrom : b)
  for (int i = 0; i < N; i++)
    b[i] += 1;
  // A reduction across teams: the team buffer in the launch environment.
  double sum = 0;
#pragma omp target teams distribute parallel for reduction(+ : sum) map(to : a)
  for (int i = 0; i < N; i++)
    sum += a[i];
  // Generic mode: each team's serial part, then a parallel region, under a thread limit.
#pragma omp target teams num_teams(3) thread_limit(64)
  {
    note(&counter[0], 1);
#pragma omp parallel
    note(&counter[1], 1);
  }
  // A plain target region (generic-SPMD, one team).
  int initial = -1;
#pragma omp target map(from : initial)
  initial = omp_is_initial_device();
  // The same image on a second device of the kind (JIT mode: compiled once for both).
  int second = -1;
  if (omp_get_num_devices() > 1) {
#pragma omp target device(1) map(from : second)
    second = omp_is_initial_device();
  }
#pragma omp target update from(counter)
  int ok = initial == 0 && b[N - 1] == 1 + 2 * (N - 1) + 1 && sum == (N - 1) * N / 2.0 &&
           counter[0] == 3;
  printf("devices %d initial %d second %d teams %d threads %d %s\n", omp_get_num_devices(),
         initial, second, counter[0], counter[1], ok ? "PASSED" : "WRONG");
  return 0;
}
