// Target regions from several threads at once, for the drop-in libomptarget tests
// (tests/tests/omptarget.rs): each thread maps its own array through data regions and target
// regions, all share one `declare target` counter updated atomically, and the main thread keeps
// a shared array mapped meanwhile. Prints PASSED; exits 1 on a wrong value.
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#pragma omp declare target
int hits = 0;
#pragma omp end declare target

enum { THREADS = 8, ROUNDS = 200, N = 512 };
static double shared_data[N];
static int failures = 0;

static void *work(void *arg) {
  long id = (long)arg;
  double a[N];
  for (int i = 0; i < N; i++) a[i] = id;
  for (int r = 0; r < ROUNDS; r++) {
#pragma omp target data map(tofrom : a[0:N])
    {
#pragma omp target map(present, alloc : shared_data[0:N])
      for (int i = 0; i < N; i++) a[i] += shared_data[i];
#pragma omp target
      {
#pragma omp atomic
        hits++;
      }
    }
  }
  for (int i = 0; i < N; i++)
    if (a[i] != id + (double)ROUNDS * i) {
      __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
      break;
    }
  return NULL;
}

int main(void) {
  for (int i = 0; i < N; i++) shared_data[i] = i;
  pthread_t t[THREADS];
#pragma omp target enter data map(to : shared_data[0:N])
  for (long i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, work, (void *)i);
  for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
#pragma omp target exit data map(delete : shared_data[0:N])
  int total = -1;
#pragma omp target map(from : total)
  total = hits;
  printf("hits %d\n", total);
  if (failures || total != THREADS * ROUNDS) {
    printf("FAIL threads: %d failures, %d hits\n", failures, total);
    return 1;
  }
  printf("PASSED\n");
  return 0;
}
