// The second translation unit of tests/omp/images.c, with a `declare target` global and a
// target region of its own.
#pragma omp declare target
int b_offset = 1;
#pragma omp end declare target

int b_square_sum(int n) {
  int sum = 0;
#pragma omp target map(tofrom : sum)
  for (int i = 0; i < n; i++) sum += (i + b_offset) * (i + b_offset);
  return sum;
}
