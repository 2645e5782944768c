/* The PoCL side of the host peer benchmark: the same kernels in OpenCL C, the same inputs and
 * decomposition (global = grid x block, local = block), timed as enqueue + clFinish.
 *
 *   pocl_runner KERNEL SIZE REPS OUT   prints "<median ms> <min ms> <compute units>" and writes the result to OUT */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "inputs.h"

static const char *SOURCE =
    "#pragma OPENCL FP_CONTRACT OFF\n"
    "__kernel void saxpy(int n, float a, __global const float *x, __global float *y) {\n"
    "  unsigned i = get_global_id(0); if (i < (unsigned)n) y[i] = a * x[i] + y[i]; }\n"
    "__kernel void stencil7(int nx, int ny, int nz, __global const double *in, __global double *out) {\n"
    "  unsigned x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);\n"
    "  unsigned X = nx, Y = ny, Z = nz; if (x >= X || y >= Y || z >= Z) return;\n"
    "  unsigned i = (z * Y + y) * X + x;\n"
    "  if (x == 0 || y == 0 || z == 0 || x == X - 1 || y == Y - 1 || z == Z - 1) { out[i] = in[i]; return; }\n"
    "  out[i] = 0.4 * in[i] + 0.1 * (in[i - 1] + in[i + 1] + in[i - X] + in[i + X] + in[i - X * Y] + in[i + X * Y]); }\n"
    "__kernel void hist(int n, int bins, __global const unsigned *in, __global unsigned *h) {\n"
    "  unsigned i = get_global_id(0); if (i < (unsigned)n) atomic_inc(&h[in[i] % (unsigned)bins]); }\n"
    "__kernel void matmul(int n, __global const float *a, __global const float *b, __global float *c) {\n"
    "  unsigned col = get_global_id(0), row = get_global_id(1), un = n;\n"
    "  if (row >= un || col >= un) return; float acc = 0.0f;\n"
    "  for (unsigned k = 0; k < un; ++k) acc += a[row * un + k] * b[k * un + col];\n"
    "  c[row * un + col] = acc; }\n"
    "__kernel void empty(void) {}\n"
    "__kernel void block_sum(__global const unsigned *in, __global unsigned *out, int n) {\n"
    "  __local unsigned partial[1024];\n"
    "  unsigned t = get_local_id(0), b = get_group_id(0), B = get_local_size(0);\n"
    "  unsigned i = b * B * 2 + t; unsigned v = 0;\n"
    "  if (i < (unsigned)n) v += in[i]; if (i + B < (unsigned)n) v += in[i + B];\n"
    "  partial[t] = v; barrier(CLK_LOCAL_MEM_FENCE);\n"
    "  for (unsigned s = B / 2; s > 0; s >>= 1) { if (t < s) partial[t] += partial[t + s]; barrier(CLK_LOCAL_MEM_FENCE); }\n"
    "  if (t == 0) out[b] = partial[0]; }\n";

#define CHECK(e) do { cl_int err_ = (e); if (err_ != CL_SUCCESS) { fprintf(stderr, "%s:%d: OpenCL error %d\n", __FILE__, __LINE__, err_); exit(1); } } while (0)

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static cl_mem buffer(cl_context ctx, void *ptr, size_t bytes, cl_mem_flags flags) {
  cl_int err;
  cl_mem m = clCreateBuffer(ctx, flags | CL_MEM_COPY_HOST_PTR, bytes, ptr, &err);
  CHECK(err);
  return m;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: pocl_runner KERNEL SIZE REPS OUT\n");
    return 2;
  }
  const char *name = argv[1];
  long size = atol(argv[2]);
  int reps = atoi(argv[3]);
  cl_platform_id platform;
  cl_device_id device;
  cl_int err;
  CHECK(clGetPlatformIDs(1, &platform, NULL));
  CHECK(clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &device, NULL));
  cl_context ctx = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
  CHECK(err);
  cl_command_queue q = clCreateCommandQueue(ctx, device, 0, &err);
  CHECK(err);
  cl_program prog = clCreateProgramWithSource(ctx, 1, &SOURCE, NULL, &err);
  CHECK(err);
  if (clBuildProgram(prog, 1, &device, "", NULL, NULL) != CL_SUCCESS) {
    char log[8192];
    clGetProgramBuildInfo(prog, device, CL_PROGRAM_BUILD_LOG, sizeof log, log, NULL);
    fprintf(stderr, "build failed: %s\n", log);
    return 1;
  }
  cl_kernel k = clCreateKernel(prog, name, &err);
  CHECK(err);
  size_t global[3] = {1, 1, 1}, local[3] = {1, 1, 1};
  cl_uint dims = 1;
  void *result = NULL;
  size_t result_bytes = 0;
  cl_mem out_buf = NULL;
#define BUF(ptr, bytes, flags) buffer(ctx, (ptr), (bytes), (flags))
  if (!strcmp(name, "saxpy")) {
    int n = (int)size;
    float a = 2.5f;
    float *x = malloc(n * 4), *y = malloc(n * 4);
    for (long i = 0; i < n; ++i) { x[i] = saxpy_x(i); y[i] = saxpy_y(i); }
    cl_mem bx = BUF(x, n * 4, CL_MEM_READ_ONLY), by = BUF(y, n * 4, CL_MEM_READ_WRITE);
    CHECK(clSetKernelArg(k, 0, 4, &n)); CHECK(clSetKernelArg(k, 1, 4, &a));
    CHECK(clSetKernelArg(k, 2, sizeof bx, &bx)); CHECK(clSetKernelArg(k, 3, sizeof by, &by));
    local[0] = 256; global[0] = (n + 255) / 256 * 256;
    out_buf = by; result_bytes = n * 4;
    /* saxpy accumulates into y: one launch for the result (taken after the first rep). */
  } else if (!strcmp(name, "stencil7")) {
    int nx = (int)size, ny = nx, nz = nx;
    long cells = (long)nx * ny * nz;
    double *in = malloc(cells * 8), *out = calloc(cells, 8);
    for (long i = 0; i < cells; ++i) in[i] = stencil_in(i);
    cl_mem bi = BUF(in, cells * 8, CL_MEM_READ_ONLY), bo = BUF(out, cells * 8, CL_MEM_READ_WRITE);
    CHECK(clSetKernelArg(k, 0, 4, &nx)); CHECK(clSetKernelArg(k, 1, 4, &ny)); CHECK(clSetKernelArg(k, 2, 4, &nz));
    CHECK(clSetKernelArg(k, 3, sizeof bi, &bi)); CHECK(clSetKernelArg(k, 4, sizeof bo, &bo));
    dims = 3; global[0] = nx; global[1] = ny; global[2] = nz; local[0] = nx;
    out_buf = bo; result_bytes = cells * 8;
  } else if (!strcmp(name, "hist")) {
    int n = (int)size, bins = 256;
    unsigned *in = malloc(n * 4), *h = calloc(bins, 4);
    for (long i = 0; i < n; ++i) in[i] = hist_in(i);
    cl_mem bi = BUF(in, n * 4, CL_MEM_READ_ONLY), bh = BUF(h, bins * 4, CL_MEM_READ_WRITE);
    CHECK(clSetKernelArg(k, 0, 4, &n)); CHECK(clSetKernelArg(k, 1, 4, &bins));
    CHECK(clSetKernelArg(k, 2, sizeof bi, &bi)); CHECK(clSetKernelArg(k, 3, sizeof bh, &bh));
    local[0] = 256; global[0] = (n + 255) / 256 * 256;
    out_buf = bh; result_bytes = bins * 4;
  } else if (!strcmp(name, "matmul")) {
    int n = (int)size;
    float *a = malloc((long)n * n * 4), *b = malloc((long)n * n * 4), *c = calloc((long)n * n, 4);
    for (long i = 0; i < (long)n * n; ++i) { a[i] = mat_a(i); b[i] = mat_b(i); }
    cl_mem ba = BUF(a, (long)n * n * 4, CL_MEM_READ_ONLY), bb = BUF(b, (long)n * n * 4, CL_MEM_READ_ONLY);
    cl_mem bc = BUF(c, (long)n * n * 4, CL_MEM_READ_WRITE);
    CHECK(clSetKernelArg(k, 0, 4, &n)); CHECK(clSetKernelArg(k, 1, sizeof ba, &ba));
    CHECK(clSetKernelArg(k, 2, sizeof bb, &bb)); CHECK(clSetKernelArg(k, 3, sizeof bc, &bc));
    dims = 2; global[0] = global[1] = (n + 15) / 16 * 16; local[0] = local[1] = 16;
    out_buf = bc; result_bytes = (long)n * n * 4;
  } else if (!strcmp(name, "empty")) {
    dims = 1;
  } else if (!strcmp(name, "block_sum")) {
    int n = (int)size;
    int blocks = (n + 511) / 512;
    unsigned *in = malloc(n * 4), *out = calloc(blocks, 4);
    for (long i = 0; i < n; ++i) in[i] = reduce_in(i);
    cl_mem bi = BUF(in, n * 4, CL_MEM_READ_ONLY), bo = BUF(out, blocks * 4, CL_MEM_READ_WRITE);
    CHECK(clSetKernelArg(k, 0, sizeof bi, &bi)); CHECK(clSetKernelArg(k, 1, sizeof bo, &bo));
    CHECK(clSetKernelArg(k, 2, 4, &n));
    local[0] = 256; global[0] = (size_t)blocks * 256;
    out_buf = bo; result_bytes = blocks * 4;
  } else {
    fprintf(stderr, "unknown kernel %s\n", name);
    return 2;
  }
  double *times = malloc(reps * sizeof *times);
  for (int r = -2; r < reps; ++r) { /* two warm-up launches */
    double t = now_ms();
    CHECK(clEnqueueNDRangeKernel(q, k, dims, NULL, global, local, 0, NULL, NULL));
    CHECK(clFinish(q));
    if (r >= 0)
      times[r] = now_ms() - t;
    if (r == -2 && result_bytes) {
      result = malloc(result_bytes);
      CHECK(clEnqueueReadBuffer(q, out_buf, CL_TRUE, 0, result_bytes, result, 0, NULL, NULL));
    }
  }
  qsort(times, reps, sizeof *times, cmp);
  cl_uint units = 0;
  CHECK(clGetDeviceInfo(device, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof units, &units, NULL));
  printf("%.6f %.6f %u\n", times[reps / 2], times[0], units);
  FILE *f = fopen(argv[4], "wb");
  if (f) {
    if (result_bytes)
      fwrite(result, 1, result_bytes, f);
    fclose(f);
  }
  return 0;
}
