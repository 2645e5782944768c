// Several images and translation units, and registration while offloading, for the drop-in
// libomptarget tests (tests/tests/omptarget.rs): this program (two translation units: this one
// and images_b.c) offloads in a loop while a second thread loads and unloads a shared library
// with target regions of its own (`lib_region.c`: its own image and descriptor, registered
// at dlopen and unregistered at dlclose), using it between. Prints PASSED; exits 1 on a wrong
// value. argv[1]: the library's path.
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

int b_square_sum(int n); // images_b.c
static const char *lib_path;
static volatile int stop = 0;
static int lib_failures = 0, lib_rounds = 0;

static void *churn(void *arg) {
  (void)arg;
  int v[64];
  for (int i = 0; i < 64; i++) v[i] = i;
  for (int r = 0; r < 40; r++) {
    void *h = dlopen(lib_path, RTLD_NOW | RTLD_LOCAL);
    if (!h) { printf("FAIL dlopen: %s\n", dlerror()); lib_failures++; break; }
    int (*f)(const int *, int) = (int (*)(const int *, int))dlsym(h, "lib_triple_sum");
    if (!f || f(v, 64) != 3 * 63 * 64 / 2) lib_failures++;
    lib_rounds++;
    dlclose(h);
  }
  stop = 1;
  return NULL;
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  lib_path = argv[1];
  pthread_t t;
  pthread_create(&t, NULL, churn, NULL);
  int rounds = 0, failures = 0;
  while (!stop || rounds < 50) {
    int x = rounds;
#pragma omp target map(tofrom : x)
    x = x * 2 + 1;
    if (x != rounds * 2 + 1) failures++;
    if (b_square_sum(100) != 338350) failures++;
    rounds++;
  }
  pthread_join(t, NULL);
  printf("main rounds %d, library rounds %d\n", rounds, lib_rounds);
  if (failures || lib_failures || lib_rounds != 40) {
    printf("FAIL images: %d main failures, %d library failures\n", failures, lib_failures);
    return 1;
  }
  printf("PASSED\n");
  return 0;
}
