// The drop-in libomptarget's benchmark program (tests/benches/omp_vs_debian.rs): built once by
// clang-19 against Debian's libomptarget, run on Debian's and on ours. Each case prints
// "case <name> <median seconds per construct>"; a wrong result exits 1.
//
//   omp_bench [ROUNDS_SCALE]     (1 by default; the harness may lower it for quick runs)
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

// omp_get_wtime's resolution is about a microsecond: too coarse for one construct.
static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *t, int n) {
  qsort(t, n, sizeof *t, cmp);
  return t[n / 2];
}

static double *times(int n) {
  double *t = malloc(sizeof(double) * n);
  if (!t) exit(2);
  return t;
}

// `reps` samples of `batch` constructs each; the median sample over `batch`.
static void map_tofrom(const char *name, long n, int reps, int batch) {
  int *a = malloc(sizeof(int) * n);
  if (!a) exit(2);
  for (long i = 0; i < n; i++) a[i] = (int)i;
  double *t = times(reps);
  for (int r = 0; r < reps; r++) {
    double s = now();
    for (int b = 0; b < batch; b++) {
#pragma omp target map(tofrom : a[0:n])
      { a[0] += 1; a[n - 1] += 1; }
    }
    t[r] = (now() - s) / batch;
  }
  int total = reps * batch;
  if (a[0] != total || a[n - 1] != (int)(n - 1) + total || a[n / 2] != (int)(n / 2)) {
    fprintf(stderr, "%s: wrong result\n", name);
    exit(1);
  }
  printf("case %s %.9f\n", name, median(t, reps));
  free(a);
  free(t);
}

int main(int argc, char **argv) {
  int scale = argc > 1 ? atoi(argv[1]) : 1;
  if (scale < 1) scale = 1;
  // The first construct initialises the device and loads the image: not measured.
#pragma omp target
  {}

  int reps = 101 * scale;
  double *t = times(reps);
  for (int r = 0; r < reps; r++) {
    double s = now();
    for (int b = 0; b < 200; b++) {
#pragma omp target
      {}
    }
    t[r] = (now() - s) / 200;
  }
  printf("case empty-region %.9f\n", median(t, reps));
  free(t);

  map_tofrom("map-tofrom-1KiB", 1024 / sizeof(int), 101 * scale, 100);
  map_tofrom("map-tofrom-64MiB", (64l << 20) / sizeof(int), 9 * scale, 1);

  long n = 16l << 20;
  float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
  if (!x || !y) exit(2);
  for (long i = 0; i < n; i++) { x[i] = 1.0f; y[i] = (float)(i % 7); }
  int sreps = 9 * scale;
  t = times(sreps);
#pragma omp target data map(to : x[0:n]) map(tofrom : y[0:n])
  for (int r = 0; r < sreps; r++) {
    double s = now();
#pragma omp target teams distribute parallel for
    for (long i = 0; i < n; i++) y[i] = 2.0f * x[i] + y[i];
    t[r] = now() - s;
  }
  for (long i = 0; i < n; i += n / 97) {
    if (y[i] != (float)(i % 7) + 2.0f * sreps) {
      fprintf(stderr, "saxpy: wrong result at %ld\n", i);
      return 1;
    }
  }
  printf("case saxpy-16M %.9f\n", median(t, sreps));
  return 0;
}
