// C++ in target regions, for the drop-in libomptarget tests (tests/tests/omptarget.rs): a
// lambda captured by value, std::complex arithmetic (libgcc's __muldc3), a class with a
// destructor in a region that can unwind (libstdc++'s __gxx_personality_v0). Built AOT and with
// -fopenmp-target-jit; each line it prints is checked; it exits 1 on a wrong value.
#include <complex>
#include <cstdio>
#include <omp.h>

struct Scaled {
  double factor;
  explicit Scaled(double f) : factor(f) {}
  ~Scaled() { factor = 0; }
  double apply(double x) const { return x * factor; }
};

static int failures = 0;
static void check(const char *what, bool ok) {
  std::printf("%s %s\n", ok ? "ok" : "FAIL", what);
  if (!ok) failures++;
}

int main() {
  enum { N = 256 };
  double a[N];
  for (int i = 0; i < N; i++) a[i] = i;
  double k = 3;
  auto scale = [=](double x) { return x * k; };
  #pragma omp target teams distribute parallel for map(tofrom: a[0:N])
  for (int i = 0; i < N; i++) a[i] = scale(a[i]);
  check("lambda by value", a[10] == 30 && a[N - 1] == 3 * (N - 1));

  std::complex<double> z[N];
  for (int i = 0; i < N; i++) z[i] = std::complex<double>(i, 1);
  #pragma omp target map(tofrom: z[0:N])
  for (int i = 0; i < N; i++) z[i] = z[i] * z[i];
  check("complex multiply", z[3] == std::complex<double>(8, 6));

  int initial = -1;
  double r = 0;
  #pragma omp target map(from: initial, r)
  {
    Scaled s(2.5);
    r = s.apply(4);
    initial = omp_is_initial_device();
  }
  check("class with a destructor", r == 10);
  check("offloaded", initial == 0);
  if (failures) return 1;
  std::printf("PASSED\n");
  return 0;
}
