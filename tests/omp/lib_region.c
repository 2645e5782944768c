// A shared library with target regions of its own (its own offload image and descriptor),
// for tests/omp/images.c: loaded and unloaded while the program offloads.
#pragma omp declare target
static int lib_scale = 3;
#pragma omp end declare target

int lib_triple_sum(const int *v, int n) {
  int sum = 0;
#pragma omp target map(to : v[0:n]) map(tofrom : sum)
  for (int i = 0; i < n; i++) sum += lib_scale * v[i];
  return sum;
}
