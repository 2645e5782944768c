// An OMPT tool in the program itself, for the drop-in libomptarget tests
// (tests/tests/omptarget.rs): it registers the device-side callbacks with libomp and prints one
// line per event ("init D", "load D", "target ID KIND BEGIN|END", "op ID OPTYPE BYTES",
// "submit ID TEAMS"); the test checks their order and ids.
#include <omp-tools.h>
#include <omp.h>
#include <stdio.h>

static void on_init(int dev, const char *type, ompt_device_t *d, ompt_function_lookup_t l,
                    const char *doc) {
  (void)d; (void)l; (void)doc;
  printf("init %d %s\n", dev, type ? type : "?");
}
static void on_load(int dev, const char *file, int64_t off, void *vma, size_t bytes, void *host,
                    void *daddr, uint64_t module) {
  (void)file; (void)off; (void)vma; (void)host; (void)daddr; (void)module;
  printf("load %d %s\n", dev, bytes > 0 ? "bytes" : "empty");
}
static void on_target(ompt_target_t kind, ompt_scope_endpoint_t ep, int dev, ompt_data_t *task,
                      ompt_id_t id, const void *code) {
  (void)task;
  printf("target %lu %d %s %d %s\n", (unsigned long)id, (int)kind,
         ep == ompt_scope_begin ? "BEGIN" : "END", dev, code ? "code" : "nocode");
}
static void on_op(ompt_id_t id, ompt_id_t op, ompt_target_data_op_t type, void *src, int sd,
                  void *dst, int dd, size_t bytes, const void *code) {
  (void)op; (void)src; (void)sd; (void)dst; (void)dd; (void)code;
  printf("op %lu %d %zu\n", (unsigned long)id, (int)type, bytes);
}
static void on_submit(ompt_id_t id, ompt_id_t op, unsigned int teams) {
  (void)op;
  printf("submit %lu %u\n", (unsigned long)id, teams);
}

static int initialize(ompt_function_lookup_t lookup, int dev, ompt_data_t *data) {
  (void)dev; (void)data;
  ompt_set_callback_t set = (ompt_set_callback_t)lookup("ompt_set_callback");
  if (!set) return 0;
  set(ompt_callback_device_initialize, (ompt_callback_t)on_init);
  set(ompt_callback_device_load, (ompt_callback_t)on_load);
  set(ompt_callback_target, (ompt_callback_t)on_target);
  set(ompt_callback_target_data_op, (ompt_callback_t)on_op);
  set(ompt_callback_target_submit, (ompt_callback_t)on_submit);
  return 1;
}
static void finalize(ompt_data_t *data) { (void)data; }

ompt_start_tool_result_t *ompt_start_tool(unsigned int v, const char *rt) {
  (void)v; (void)rt;
  static ompt_start_tool_result_t r = {&initialize, &finalize, {0}};
  return &r;
}

int main(void) {
  int a[64], n = 64;
  for (int i = 0; i < n; i++) a[i] = i;
#pragma omp target teams distribute parallel for num_teams(2) map(tofrom : a[0:n])
  for (int i = 0; i < n; i++) a[i] *= 2;
#pragma omp target enter data map(to : a[0:n])
#pragma omp target exit data map(from : a[0:n])
  printf("result %d\n", a[63]);
  return a[63] != 126;
}
