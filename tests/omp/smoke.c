// An OpenMP offload program of the common constructs, for the drop-in libomptarget tests
// (tests/tests/omptarget.rs). Each line it prints is checked; it exits 1 on a wrong value.
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#pragma omp declare target
int counter = 5;
#pragma omp end declare target

struct list { int n; double *data; };

static int failures = 0;
static void check(const char *what, int ok) {
  printf("%s %s\n", ok ? "ok" : "FAIL", what);
  if (!ok) failures++;
}

int main(void) {
  enum { N = 1000 };
  double a[N], sum = 0;
  for (int i = 0; i < N; i++) a[i] = i;

  int initial = -1;
  #pragma omp target map(from: initial)
  { initial = omp_is_initial_device(); }
  check("offloaded", initial == 0);
  printf("devices %d\n", omp_get_num_devices());

  #pragma omp target teams distribute parallel for map(tofrom: a[0:N]) reduction(+: sum)
  for (int i = 0; i < N; i++) { a[i] *= 2; sum += a[i]; }
  check("tofrom and reduction", sum == 999000.0 && a[999] == 1998.0);

  // A data region: the device copy lives across two target regions; update brings it back.
  double b[N];
  for (int i = 0; i < N; i++) b[i] = 1;
  #pragma omp target data map(to: b[0:N])
  {
    #pragma omp target
    for (int i = 0; i < N; i++) b[i] += 1;
    check("present inside the region", omp_target_is_present(b, omp_get_default_device()));
    check("host copy untouched before update", b[0] == 1);
    #pragma omp target update from(b[0:N])
    check("update from", b[0] == 2 && b[N - 1] == 2);
  }
  check("unmapped after the region", !omp_target_is_present(b, omp_get_default_device()));

  // enter / exit data, with reference counts: two enters need two exits (or a delete).
  int c[16];
  for (int i = 0; i < 16; i++) c[i] = i;
  #pragma omp target enter data map(to: c[0:16])
  #pragma omp target enter data map(to: c[0:16])
  #pragma omp target
  for (int i = 0; i < 16; i++) c[i] *= 10;
  #pragma omp target exit data map(from: c[0:16])
  check("still mapped after one exit (no copy back yet)", c[3] == 3 && omp_target_is_present(c, omp_get_default_device()));
  #pragma omp target exit data map(from: c[0:16])
  check("copied back by the last exit", c[3] == 30 && !omp_target_is_present(c, omp_get_default_device()));

  // A declare target global: its own device copy, updated explicitly.
  counter = 7;
  #pragma omp target update to(counter)
  #pragma omp target
  { counter += 1; }
  check("global before update from", counter == 7);
  #pragma omp target update from(counter)
  check("global after update from", counter == 8);

  // firstprivate scalars and a pointer attached to its pointee (PTR_AND_OBJ).
  int k = 3;
  double *p = malloc(8 * sizeof(double));
  for (int i = 0; i < 8; i++) p[i] = i;
  struct list l = { 8, p };
  #pragma omp target map(tofrom: l.data[0:8]) map(to: l.n) firstprivate(k)
  for (int i = 0; i < l.n; i++) l.data[i] += k;
  check("pointer attached to its pointee", p[7] == 10.0 && l.data == p);

  // The device memory API.
  int dev = omp_get_default_device(), host = omp_get_initial_device();
  int *d = omp_target_alloc(64 * sizeof(int), dev);
  int src[64], dst[64];
  for (int i = 0; i < 64; i++) { src[i] = i * i; dst[i] = -1; }
  int r1 = omp_target_memcpy(d, src, sizeof src, 0, 0, dev, host);
  #pragma omp target is_device_ptr(d)
  for (int i = 0; i < 64; i++) d[i] += 1;
  int r2 = omp_target_memcpy(dst, d, sizeof dst, 0, 0, host, dev);
  check("omp_target_alloc and memcpy", d != NULL && r1 == 0 && r2 == 0 && dst[63] == 63 * 63 + 1);
  int assoc[4] = { 0, 0, 0, 0 };
  check("associate", omp_target_associate_ptr(assoc, d, sizeof assoc, 0, dev) == 0 &&
                     omp_target_is_present(assoc, dev) && omp_get_mapped_ptr(assoc, dev) == d);
  check("disassociate", omp_target_disassociate_ptr(assoc, dev) == 0 && !omp_target_is_present(assoc, dev));
  omp_target_free(d, dev);

  free(p);
  printf("%s\n", failures ? "FAILED" : "PASSED");
  return failures ? 1 : 0;
}
