// A program of its own registration (tests/tests/omptarget_gpu.rs): one device image read from
// a file (argv[1]) whose kernel argv[2] takes one mapped int (map(from)), run as a non-teams
// target region on the default device; prints the device count and the outcome.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
struct entry { void *addr; char *name; size_t size; int32_t flags, data; };
struct image { void *start, *end; struct entry *eb, *ee; };
struct desc { int32_t n; struct image *images; struct entry *hb, *he; };
struct kargs { uint32_t version, nargs; void **bases, **ptrs; int64_t *sizes, *types;
               void **names, **mappers; uint64_t tripcount, flags; uint32_t teams[3], threads[3], dyn; };
void __tgt_register_lib(struct desc *);
void __tgt_unregister_lib(struct desc *);
int __tgt_target_kernel(void *, int64_t, int32_t, int32_t, void *, struct kargs *);
int omp_get_num_devices(void);
static char region;
int main(int argc, char **argv) {
  if (argc < 3) return 3;
  FILE *f = fopen(argv[1], "rb");
  if (!f) return 3;
  static unsigned char buf[1 << 22];
  size_t len = fread(buf, 1, sizeof buf, f);
  fclose(f);
  struct entry e = { &region, argv[2], 0, 0, 0 };
  struct image img = { buf, buf + len, &e, &e + 1 };
  struct desc d = { 1, &img, &e, &e + 1 };
  __tgt_register_lib(&d);
  int initial = -1;
  void *base[1] = { &initial };
  int64_t size[1] = { sizeof initial }, type[1] = { 0x22 };
  struct kargs ka = { 3, 1, base, base, size, type, 0, 0, 0, 0, { (uint32_t)-1, 0, 0 }, { 0, 0, 0 }, 0 };
  int r = __tgt_target_kernel(NULL, -1, -1, 0, &region, &ka);
  printf("devices %d rc %d\n", omp_get_num_devices(), r);
  __tgt_unregister_lib(&d);
  return 0;
}
