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

// `chunks` pieces of `len` floats, each copied in, computed on and copied back by its own
// target region: all `nowait` then one taskwait, or one after the other. With queued
// `nowait` regions a device can copy one chunk while it computes on another; the time is per
// sample (all chunks), so the two cases compare directly.
static void chunks_case(const char *name, int nowait, int chunks, long len, int reps) {
  float *a = malloc(sizeof(float) * chunks * len);
  if (!a) exit(2);
  for (long i = 0; i < chunks * len; i++) a[i] = (float)(i % 5);
  double *t = times(reps);
  for (int r = 0; r < reps; r++) {
    double s = now();
    for (int c = 0; c < chunks; c++) {
      float *p = a + c * len;
      if (nowait) {
#pragma omp target teams distribute parallel for map(tofrom : p[0:len]) nowait
        for (long i = 0; i < len; i++) {
          float v = p[i];
          for (int k = 0; k < 32; k++) v = v * 0.5f + 1.0f;
          p[i] = v - 1.0f;
        }
      } else {
#pragma omp target teams distribute parallel for map(tofrom : p[0:len])
        for (long i = 0; i < len; i++) {
          float v = p[i];
          for (int k = 0; k < 32; k++) v = v * 0.5f + 1.0f;
          p[i] = v - 1.0f;
        }
      }
    }
#pragma omp taskwait
    t[r] = now() - s;
  }
  // v -> v/2 + 1 converges to 2 from below or above: after 32 steps each value is 2 to within
  // 2^-29 of its start's distance, so every element is 1 (to float precision) after one round.
  for (long i = 0; i < chunks * len; i += len / 3 + 1) {
    if (a[i] < 0.999f || a[i] > 1.001f) {
      fprintf(stderr, "%s: wrong result at %ld: %f\n", name, i, a[i]);
      exit(1);
    }
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

  // Eight 4 MiB chunks, each its own region: blocking, then nowait.
  chunks_case("chunks-8x4MiB-blocking", 0, 8, 1l << 20, 9 * scale);
  chunks_case("chunks-8x4MiB-nowait", 1, 8, 1l << 20, 9 * scale);
  return 0;
}
