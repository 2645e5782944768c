/* The native side of the host peer benchmark: the same computations as plain loops with
 * OpenMP (clang-19 -O3 -march=native -fopenmp), the same inputs, timed per run.
 *
 *   omp_runner KERNEL SIZE REPS OUT   prints "<median ms> <min ms> <threads>" and writes the result to OUT */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "inputs.h"

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* What the "empty" case calls per item: a function the compiler cannot see into. */
__attribute__((noinline)) void empty_item(void) { __asm__ volatile(""); }

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: omp_runner KERNEL SIZE REPS OUT\n");
    return 2;
  }
  const char *name = argv[1];
  long size = atol(argv[2]);
  int reps = atoi(argv[3]);
  double *times = malloc(reps * sizeof *times);
  void *result = NULL;
  size_t result_bytes = 0;
  void *live = NULL;
  size_t live_bytes = 0;
  for (int r = -2; r < reps; ++r) {
    double t;
    if (!strcmp(name, "saxpy")) {
      static float *x, *y;
      long n = size;
      if (!x) { x = malloc(n * 4); y = malloc(n * 4); for (long i = 0; i < n; ++i) { x[i] = saxpy_x(i); y[i] = saxpy_y(i); } }
      const float a = 2.5f;
      t = now_ms();
#pragma omp parallel for simd schedule(static)
      for (long i = 0; i < n; ++i) y[i] = a * x[i] + y[i];
      live = y; live_bytes = n * 4;
    } else if (!strcmp(name, "stencil7")) {
      static double *in, *out;
      long X = size, Y = size, Z = size, cells = X * Y * Z;
      if (!in) { in = malloc(cells * 8); out = calloc(cells, 8); for (long i = 0; i < cells; ++i) in[i] = stencil_in(i); }
      t = now_ms();
#pragma omp parallel for collapse(2) schedule(static)
      for (long z = 0; z < Z; ++z)
        for (long y = 0; y < Y; ++y)
#pragma omp simd
          for (long x = 0; x < X; ++x) {
            long i = (z * Y + y) * X + x;
            if (x == 0 || y == 0 || z == 0 || x == X - 1 || y == Y - 1 || z == Z - 1) out[i] = in[i];
            else out[i] = 0.4 * in[i] + 0.1 * (in[i - 1] + in[i + 1] + in[i - X] + in[i + X] + in[i - X * Y] + in[i + X * Y]);
          }
      live = out; live_bytes = cells * 8;
    } else if (!strcmp(name, "hist")) {
      static unsigned *in, *h;
      long n = size;
      if (!in) { in = malloc(n * 4); h = calloc(256, 4); for (long i = 0; i < n; ++i) in[i] = hist_in(i); }
      if (r == -2) memset(h, 0, 256 * 4);
      t = now_ms();
#pragma omp parallel for schedule(static)
      for (long i = 0; i < n; ++i) {
#pragma omp atomic
        h[in[i] % 256u] += 1;
      }
      live = h; live_bytes = 256 * 4;
    } else if (!strcmp(name, "matmul")) {
      static float *a, *b, *c;
      long n = size;
      if (!a) { a = malloc(n * n * 4); b = malloc(n * n * 4); c = calloc(n * n, 4); for (long i = 0; i < n * n; ++i) { a[i] = mat_a(i); b[i] = mat_b(i); } }
      t = now_ms();
#pragma omp parallel for schedule(static)
      for (long row = 0; row < n; ++row)
        for (long col = 0; col < n; ++col) {
          float acc = 0.0f;
          for (long k = 0; k < n; ++k) acc += a[row * n + k] * b[k * n + col];
          c[row * n + col] = acc;
        }
      live = c; live_bytes = n * n * 4;
    } else if (!strcmp(name, "empty")) {
      long n = size; /* work items */
      t = now_ms();
      if (n <= 1) {
#pragma omp parallel
        { empty_item(); }
      } else {
#pragma omp parallel for schedule(static)
        for (long i = 0; i < n; ++i) empty_item();
      }
    } else if (!strcmp(name, "block_sum")) {
      static unsigned *in, *out;
      long n = size, blocks = (n + 511) / 512;
      if (!in) { in = malloc(n * 4); out = calloc(blocks, 4); for (long i = 0; i < n; ++i) in[i] = reduce_in(i); }
      t = now_ms();
      /* The same tree per block, as the GPU semantics define it (integer sums: any order). */
#pragma omp parallel for schedule(static)
      for (long b = 0; b < blocks; ++b) {
        unsigned s = 0;
        for (long i = b * 512; i < b * 512 + 512 && i < n; ++i) s += in[i];
        out[b] = s;
      }
      live = out; live_bytes = blocks * 4;
    } else {
      fprintf(stderr, "unknown kernel %s\n", name);
      return 2;
    }
    double dt = now_ms() - t;
    if (r >= 0) times[r] = dt;
    /* The result of the first run (saxpy and hist accumulate over runs). */
    if (r == -2 && live_bytes) {
      result = malloc(live_bytes);
      memcpy(result, live, live_bytes);
      result_bytes = live_bytes;
    }
  }
  qsort(times, reps, sizeof *times, cmp);
  printf("%.6f %.6f %d\n", times[reps / 2], times[0], omp_get_max_threads());
  FILE *f = fopen(argv[4], "wb");
  if (f) {
    if (result_bytes) fwrite(result, 1, result_bytes, f);
    fclose(f);
  }
  return 0;
}
