/* A fake Level Zero GPU driver that the real loader (libze_loader.so.1, Debian's libze1) loads
 * through its alternate-driver list (ZE_ENABLE_ALT_DRIVERS=/path/to/this.so): every DDI table
 * getter the loader requires, and behind them a GPU without a GPU, with the behaviour that
 * matters to the plugin (tests/tests/level_zero_fake_driver.rs):
 *
 *   - immediate command lists run their operations later, on a thread of their own
 *     (FAKE_ZE_DELAY_US, default 20, per operation), so a missing wait or an early free shows
 *     ("use-after-free"); and, as the spec allows, only barriers order them: the commands
 *     between two barriers run last first (see list_worker), so work that relies on
 *     completion order without a barrier goes wrong; events are signalled when the list
 *     reaches them (a signal that is no barrier, possibly before the work ahead of it);
 *   - modules: SPIR-V (its OpEntryPoint Kernel names and parameters are read; a kernel named
 *     `does_not_build` fails the build with a log) and native binaries (ELF machine 205, one
 *     `.text.<kernel>` section per kernel whose first words are its parameter count and the mask
 *     of its `__local` parameters);
 *   - kernels check every argument (index, size, `__local` pointers as a size with no value)
 *     and the group size; a kernel with parameters not all set is not launched;
 *   - `saxpy(n, a, x, y)`, `add_k(n, k, x)` and `reverse(in, out, __local tmp)` (each work-group
 *     reverses its slice through local memory) are computed; `fault` (or the kernel named by
 *     FAKE_ZE_FAULT) loses the device: the wait returns ZE_RESULT_ERROR_DEVICE_LOST, and so
 *     does every later wait; after a launch of the kernel FAKE_ZE_SYNC_GIVES_UP="name:status"
 *     names, the next host wait for an event returns `status` at once, without waiting (the
 *     work still runs, later); FAKE_ZE_COPY_HANGS=N holds a copy of N bytes instead of running
 *     it, the next host wait gives up (ZE_RESULT_NOT_READY), and the copy runs, writing late,
 *     when the test calls fake_ze_finish_held_copies;
 *   - memory: device, host and shared allocations from the heap, FAKE_ZE_MEMORY bytes of
 *     device memory at most (ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY beyond), frees of anything
 *     not allocated logged ("bad-free"), copies outside allocations logged ("bad-copy"), and
 *     overlapping copies done the wrong way (the copy engine of fake_common.h);
 *   - FAKE_ZE_DEVICES GPUs (default 1), FAKE_ZE_IP_VERSION (default 0x030dc004, 12.55.4;
 *     0 leaves the IP version extension unanswered).
 *
 * Every call the plugin makes is logged to FAKE_ZE_LOG, launches with each argument's bytes. */
#include <level_zero/ze_api.h>
#include <level_zero/ze_ddi.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

#define FAKE_LOG_VARIABLE "FAKE_ZE_LOG"
#include "../fake-common/fake_common.h"

/* ---- drivers, devices, contexts ---------------------------------------------------------- */

static int driver_tag;
struct device {
  int index;
  int lost; /* a kernel faulted: its work is lost */
};
static struct device devices[4] = {{0, 0}, {1, 0}, {2, 0}, {3, 0}};

static int device_count(void) {
  const char *e = getenv("FAKE_ZE_DEVICES");
  int n = e ? atoi(e) : 1;
  return n < 0 ? 0 : n > 4 ? 4 : n;
}

static int is_device(ze_device_handle_t d) {
  for (int i = 0; i < device_count(); ++i)
    if ((void *)d == (void *)&devices[i])
      return 1;
  return 0;
}

struct context {
  int live;
};

static ze_result_t ZE_APICALL f_init(ze_init_flags_t flags) {
  say("zeInit %u\n", flags);
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL f_driver_get(uint32_t *count, ze_driver_handle_t *drivers) {
  if (!count)
    return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (drivers && *count >= 1)
    drivers[0] = (ze_driver_handle_t)&driver_tag;
  *count = 1;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL f_driver_api_version(ze_driver_handle_t d, ze_api_version_t *v) {
  (void)d;
  *v = ZE_API_VERSION_1_4;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL f_driver_properties(ze_driver_handle_t d, ze_driver_properties_t *p) {
  (void)d;
  memset(p->uuid.id, 0x5a, sizeof p->uuid.id);
  p->driverVersion = 1;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL f_device_get(ze_driver_handle_t d, uint32_t *count, ze_device_handle_t *out) {
  if ((void *)d != &driver_tag)
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  int n = device_count();
  if (out)
    for (int i = 0; i < n && i < (int)*count; ++i)
      out[i] = (ze_device_handle_t)&devices[i];
  if (!out || *count > (uint32_t)n)
    *count = (uint32_t)n;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL f_device_properties(ze_device_handle_t d, ze_device_properties_t *p) {
  if (!is_device(d))
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (p->stype != ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES) {
    say("bad-stype device-properties %#x\n", p->stype);
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  }
  int i = ((struct device *)d)->index;
  p->type = ZE_DEVICE_TYPE_GPU;
  p->vendorId = 0x8086;
  p->deviceId = 0x0bd5;
  p->flags = 0;
  p->coreClockRate = 1600;
  p->maxMemAllocSize = 4ull << 30;
  p->numThreadsPerEU = 8;
  p->physicalEUSimdWidth = 16;
  p->numEUsPerSubslice = 8;
  p->numSubslicesPerSlice = 8;
  p->numSlices = 1;
  snprintf(p->name, sizeof p->name, "Fake Level Zero GPU %d", i);
  /* The IP version extension (0x1000f), wherever it is in the chain. */
  const char *e = getenv("FAKE_ZE_IP_VERSION");
  uint32_t ip = e ? (uint32_t)strtoul(e, 0, 0) : 0x030dc004u;
  for (ze_base_properties_t *x = p->pNext; x; x = x->pNext)
    if ((uint32_t)x->stype == 0x1000fu && ip != 0) {
      uint32_t *ip_field = (uint32_t *)((char *)x + 16);
      *ip_field = ip;
    }
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL f_device_compute(ze_device_handle_t d, ze_device_compute_properties_t *p) {
  if (!is_device(d))
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  p->maxTotalGroupSize = 1024;
  p->maxGroupSizeX = p->maxGroupSizeY = p->maxGroupSizeZ = 1024;
  p->maxGroupCountX = p->maxGroupCountY = p->maxGroupCountZ = 65535;
  p->maxSharedLocalMemory = 65536;
  p->numSubGroupSizes = 2;
  p->subGroupSizes[0] = 16;
  p->subGroupSizes[1] = 32;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL f_device_memory(ze_device_handle_t d, uint32_t *count, ze_device_memory_properties_t *p) {
  if (!is_device(d))
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (p && *count >= 1) {
    p[0].totalSize = 16ull << 30;
    p[0].maxClockRate = 3200;
    p[0].maxBusWidth = 4096;
    snprintf(p[0].name, sizeof p[0].name, "HBM");
  }
  *count = 1;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL f_device_queue_groups(ze_device_handle_t d, uint32_t *count, ze_command_queue_group_properties_t *p) {
  if (!is_device(d))
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (p && *count >= 2) {
    /* A copy-only group first, so that the plugin must look for the compute one. */
    p[0].flags = ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COPY;
    p[0].numQueues = 2;
    p[1].flags = ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE | ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COPY;
    p[1].numQueues = 4;
  }
  *count = 2;
  return ZE_RESULT_SUCCESS;
}

static int is_context(ze_context_handle_t c) { return c && ((struct context *)c)->live == 0x5ca1ab1e; }

static ze_result_t ZE_APICALL f_context_create(ze_driver_handle_t d, const ze_context_desc_t *desc, ze_context_handle_t *out) {
  if ((void *)d != &driver_tag || !desc || desc->stype != ZE_STRUCTURE_TYPE_CONTEXT_DESC)
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  struct context *c = calloc(1, sizeof *c);
  c->live = 0x5ca1ab1e;
  *out = (ze_context_handle_t)c;
  say("context-create\n");
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL f_context_destroy(ze_context_handle_t c) {
  if (!is_context(c))
    return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  ((struct context *)c)->live = 0;
  say("context-destroy\n");
  return ZE_RESULT_SUCCESS;
}

#define NEED_CONTEXT(c)                                                                          \
  do {                                                                                           \
    if (!is_context(c)) {                                                                        \
      say("bad-context %s\n", __func__);                                                         \
      return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;                                                \
    }                                                                                            \
  } while (0)

/* ---- memory ------------------------------------------------------------------------------ */

struct allocation {
  uintptr_t base;
  size_t size;
  int kind; /* 1 device, 2 host, 3 shared */
  ze_context_handle_t context;
};
static struct allocation allocations[4096];
static size_t device_bytes;

/* The allocation `[p, p + n)` lies in, or 0 (call with `lock` held). */
static struct allocation *inside(uintptr_t p, size_t n) {
  for (int i = 0; i < 4096; ++i)
    if (allocations[i].base && p >= allocations[i].base && p + n <= allocations[i].base + allocations[i].size)
      return &allocations[i];
  return 0;
}

static ze_result_t allocate(ze_context_handle_t c, size_t size, int kind, void **out) {
  NEED_CONTEXT(c);
  if (!out || size == 0)
    return ZE_RESULT_ERROR_INVALID_SIZE;
  const char *limit = getenv("FAKE_ZE_MEMORY");
  pthread_mutex_lock(&lock);
  if (kind == 1 && limit && device_bytes + size > strtoull(limit, 0, 10)) {
    pthread_mutex_unlock(&lock);
    say("alloc-refused %zu\n", size);
    return ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY;
  }
  void *p = 0;
  if (posix_memalign(&p, 64, size)) {
    pthread_mutex_unlock(&lock);
    return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  }
  memset(p, 0xcd, size);
  int slot = -1;
  for (int i = 0; i < 4096 && slot < 0; ++i)
    if (!allocations[i].base)
      slot = i;
  if (slot < 0) {
    pthread_mutex_unlock(&lock);
    free(p);
    return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  }
  allocations[slot] = (struct allocation){(uintptr_t)p, size, kind, c};
  if (kind == 1)
    device_bytes += size;
  pthread_mutex_unlock(&lock);
  *out = p;
  say("alloc %d 0x%lx %zu\n", kind, (unsigned long)(uintptr_t)p, size);
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL f_alloc_device(ze_context_handle_t c, const ze_device_mem_alloc_desc_t *desc, size_t size, size_t align, ze_device_handle_t d, void **out) {
  (void)align;
  if (!desc || desc->stype != ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC || !is_device(d))
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  return allocate(c, size, 1, out);
}

static ze_result_t ZE_APICALL f_alloc_host(ze_context_handle_t c, const ze_host_mem_alloc_desc_t *desc, size_t size, size_t align, void **out) {
  (void)align;
  if (!desc || desc->stype != ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC)
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  return allocate(c, size, 2, out);
}

static ze_result_t ZE_APICALL f_alloc_shared(ze_context_handle_t c, const ze_device_mem_alloc_desc_t *dd, const ze_host_mem_alloc_desc_t *hd, size_t size, size_t align, ze_device_handle_t d, void **out) {
  (void)align;
  if (!dd || dd->stype != ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC || !hd || hd->stype != ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC || (d && !is_device(d)))
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  return allocate(c, size, 3, out);
}

static ze_result_t ZE_APICALL f_free(ze_context_handle_t c, void *p) {
  NEED_CONTEXT(c);
  pthread_mutex_lock(&lock);
  for (int i = 0; i < 4096; ++i)
    if (allocations[i].base == (uintptr_t)p && p) {
      if (allocations[i].kind == 1)
        device_bytes -= allocations[i].size;
      allocations[i].base = 0;
      pthread_mutex_unlock(&lock);
      free(p);
      say("free 0x%lx\n", (unsigned long)(uintptr_t)p);
      return ZE_RESULT_SUCCESS;
    }
  pthread_mutex_unlock(&lock);
  say("bad-free 0x%lx\n", (unsigned long)(uintptr_t)p);
  return ZE_RESULT_ERROR_INVALID_ARGUMENT;
}

/* ---- modules and kernels ----------------------------------------------------------------- */

#define MAX_KERNELS 32
#define MAX_ARGS 16

#define MAX_GLOBALS 8

struct module {
  int count;
  char names[MAX_KERNELS][64];
  int nargs[MAX_KERNELS];
  unsigned local_mask[MAX_KERNELS]; /* bit i: parameter i is a __local pointer */
  /* Each parameter's size as its SPIR-V type says (0: not known, a native binary's). */
  unsigned char arg_size[MAX_KERNELS][MAX_ARGS];
  /* Exported globals (LinkageAttributes ... Export) with byte-array initialisers, in device
   * memory of the module's context. */
  int nglobals;
  char global_names[MAX_GLOBALS][64];
  void *global_ptrs[MAX_GLOBALS];
  size_t global_sizes[MAX_GLOBALS];
  ze_context_handle_t context;
};

struct build_log {
  char *text; /* 0: empty */
};

static uint32_t word_at(const unsigned char *b, size_t i) {
  uint32_t w;
  memcpy(&w, b + 4 * i, 4);
  return w;
}

static pthread_mutex_t spirv_lock = PTHREAD_MUTEX_INITIALIZER;
static int read_spirv_locked(const unsigned char *b, size_t len, struct module *m);

/* The kernels and exported globals of a SPIR-V module (the plugin has checked its structure);
 * modules may be created from several threads at once. */
static int read_spirv(const unsigned char *b, size_t len, struct module *m) {
  pthread_mutex_lock(&spirv_lock);
  int ok = read_spirv_locked(b, len, m);
  pthread_mutex_unlock(&spirv_lock);
  return ok;
}

static int read_spirv_locked(const unsigned char *b, size_t len, struct module *m) {
  size_t words = len / 4;
  static uint32_t fn_type[1 << 16], ptr_storage[1 << 16], entry_fn[MAX_KERNELS];
  static uint32_t type_width[1 << 16]; /* an OpTypeInt's or OpTypeFloat's width */
  static uint32_t fn_params[1 << 16][MAX_ARGS + 1];
  static uint32_t constant[1 << 16], composite_at[1 << 16], var_init[1 << 16];
  uint32_t export_var[MAX_GLOBALS];
  memset(fn_type, 0, sizeof fn_type);
  memset(type_width, 0, sizeof type_width);
  memset(ptr_storage, 0xff, sizeof ptr_storage);
  memset(fn_params, 0, sizeof fn_params);
  memset(composite_at, 0, sizeof composite_at);
  memset(var_init, 0, sizeof var_init);
  for (size_t at = 5; at < words;) {
    uint32_t w = word_at(b, at), count = w >> 16, op = w & 0xffff;
    if (count == 0 || at + count > words)
      return 0;
    uint32_t id2 = count >= 3 ? word_at(b, at + 2) : 0;
    if ((op == 21 || op == 22) && count >= 3 && word_at(b, at + 1) < (1u << 16))
      type_width[word_at(b, at + 1)] = word_at(b, at + 2);
    if (op == 43 && count >= 4 && id2 < (1u << 16)) {
      constant[id2] = word_at(b, at + 3);
    } else if (op == 44 && id2 < (1u << 16)) {
      composite_at[id2] = (uint32_t)at;
    } else if (op == 59 && count >= 5 && id2 < (1u << 16) && word_at(b, at + 3) == 5) {
      var_init[id2] = word_at(b, at + 4);
    } else if (op == 71 && count >= 4 && word_at(b, at + 2) == 41 && m->nglobals < MAX_GLOBALS) {
      /* OpDecorate %var LinkageAttributes "name" Export: the linkage type is the last word. */
      if (word_at(b, at + count - 1) == 0) {
        export_var[m->nglobals] = word_at(b, at + 1);
        snprintf(m->global_names[m->nglobals], 64, "%s", (const char *)b + 4 * (at + 3));
        m->nglobals++;
      }
    }
    if (op == 15 && count >= 4 && word_at(b, at + 1) == 6 && m->count < MAX_KERNELS) {
      entry_fn[m->count] = word_at(b, at + 2);
      snprintf(m->names[m->count], 64, "%s", (const char *)b + 4 * (at + 3));
      m->count++;
    } else if (op == 32 && count >= 4 && word_at(b, at + 1) < (1u << 16)) {
      ptr_storage[word_at(b, at + 1)] = word_at(b, at + 2);
    } else if (op == 33 && count >= 3 && word_at(b, at + 1) < (1u << 16)) {
      uint32_t id = word_at(b, at + 1);
      uint32_t n = count - 3 > MAX_ARGS ? MAX_ARGS : count - 3;
      fn_params[id][0] = n;
      for (uint32_t i = 0; i < n; ++i)
        fn_params[id][i + 1] = word_at(b, at + 3 + i);
    } else if (op == 54 && count >= 5 && word_at(b, at + 2) < (1u << 16)) {
      fn_type[word_at(b, at + 2)] = word_at(b, at + 4);
    }
    at += count;
  }
  /* Each exported global: its initialiser's constituents, one byte each, in device memory. */
  int kept = 0;
  for (int g = 0; g < m->nglobals; ++g) {
    uint32_t var = export_var[g] < (1u << 16) ? export_var[g] : 0;
    uint32_t init = var_init[var] < (1u << 16) ? var_init[var] : 0;
    uint32_t at = composite_at[init];
    if (!init || !at)
      continue;
    size_t n = (word_at(b, at) >> 16) - 3;
    unsigned char *bytes = calloc(n ? n : 1, 1);
    for (size_t i = 0; i < n; ++i) {
      uint32_t c = word_at(b, at + 3 + i);
      bytes[i] = (unsigned char)constant[c < (1u << 16) ? c : 0];
    }
    void *p = 0;
    if (allocate(m->context, n ? n : 1, 1, &p) == ZE_RESULT_SUCCESS) {
      memcpy(p, bytes, n);
      if (kept != g)
        memcpy(m->global_names[kept], m->global_names[g], 64);
      m->global_ptrs[kept] = p;
      m->global_sizes[kept] = n;
      kept++;
    }
    free(bytes);
  }
  m->nglobals = kept;
  for (int k = 0; k < m->count; ++k) {
    uint32_t f = entry_fn[k] < (1u << 16) ? entry_fn[k] : 0;
    uint32_t t = fn_type[f] < (1u << 16) ? fn_type[f] : 0;
    m->nargs[k] = (int)fn_params[t][0];
    for (int i = 0; i < m->nargs[k]; ++i) {
      uint32_t p = fn_params[t][i + 1];
      if (p < (1u << 16) && ptr_storage[p] == 4)
        m->local_mask[k] |= 1u << i;
      if (p < (1u << 16))
        m->arg_size[k][i] = ptr_storage[p] != 0xffffffffu ? 8 : (unsigned char)(type_width[p] / 8);
    }
  }
  return 1;
}

/* The kernels of a native binary: `.text.<kernel>` sections, each starting with its parameter
 * count and the mask of its `__local` pointer parameters (what a real driver reads from the
 * binary's .ze_info). */
static int read_native(const unsigned char *b, size_t len, struct module *m) {
  struct elf e;
  struct elf_section names, s;
  uint16_t machine;
  if (len < 64)
    return 0;
  memcpy(&machine, b + 18, 2);
  if (machine != 205 || !elf_open(&e, b, len) || !elf_section(&e, e.shstrndx, &names))
    return 0;
  for (uint16_t i = 0; i < e.shnum && m->count < MAX_KERNELS; ++i) {
    if (!elf_section(&e, i, &s) || s.name >= names.size)
      continue;
    const char *n = (const char *)b + names.off + s.name;
    if (strncmp(n, ".text.", 6) || s.size < 4)
      continue;
    snprintf(m->names[m->count], 64, "%s", n + 6);
    uint32_t args, locals = 0;
    memcpy(&args, b + s.off, 4);
    if (s.size >= 8)
      memcpy(&locals, b + s.off + 4, 4);
    m->nargs[m->count] = args > MAX_ARGS ? MAX_ARGS : (int)args;
    m->local_mask[m->count] = locals;
    m->count++;
  }
  return m->count > 0;
}

static ze_result_t ZE_APICALL f_module_create(ze_context_handle_t c, ze_device_handle_t d, const ze_module_desc_t *desc, ze_module_handle_t *out, ze_module_build_log_handle_t *log_out) {
  NEED_CONTEXT(c);
  if (!is_device(d) || !desc || desc->stype != ZE_STRUCTURE_TYPE_MODULE_DESC || !desc->pInputModule || !out)
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  struct build_log *log = calloc(1, sizeof *log);
  if (log_out)
    *log_out = (ze_module_build_log_handle_t)log;
  struct module *m = calloc(1, sizeof *m);
  m->context = c;
  int ok = desc->format == ZE_MODULE_FORMAT_IL_SPIRV ? read_spirv(desc->pInputModule, desc->inputSize, m)
                                                     : read_native(desc->pInputModule, desc->inputSize, m);
  say("module %s %zu %d\n", desc->format == ZE_MODULE_FORMAT_IL_SPIRV ? "spirv" : "native", desc->inputSize, m->count);
  if (!ok) {
    log->text = strdup("error: the fake driver cannot read this module");
    free(m);
    if (!log_out)
      free(log->text), free(log);
    return desc->format == ZE_MODULE_FORMAT_NATIVE ? ZE_RESULT_ERROR_INVALID_NATIVE_BINARY : ZE_RESULT_ERROR_MODULE_BUILD_FAILURE;
  }
  for (int k = 0; k < m->count; ++k)
    if (!strcmp(m->names[k], "does_not_build")) {
      /* FAKE_ZE_BUILD_LOG_BYTES makes the log that long (warnings after the error). */
      const char *first = "error: in kernel 'does_not_build': undefined function 'no_such_builtin'\n";
      const char *e = getenv("FAKE_ZE_BUILD_LOG_BYTES");
      size_t want = e ? (size_t)atol(e) : 0, n = strlen(first);
      if (want < n)
        want = n;
      log->text = malloc(want + 1);
      memcpy(log->text, first, n);
      for (size_t i = n; i < want; ++i)
        log->text[i] = (i - n) % 64 == 63 ? '\n' : 'w';
      log->text[want] = 0;
      free(m);
      if (!log_out)
        free(log->text), free(log);
      return ZE_RESULT_ERROR_MODULE_BUILD_FAILURE;
    }
  if (!log_out)
    free(log);
  *out = (ze_module_handle_t)m;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL f_module_destroy(ze_module_handle_t mh) {
  struct module *m = (struct module *)mh;
  for (int g = 0; g < m->nglobals; ++g)
    f_free(m->context, m->global_ptrs[g]);
  free(m);
  say("module-destroy\n");
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL f_log_string(ze_module_build_log_handle_t l, size_t *size, char *text) {
  struct build_log *log = (struct build_log *)l;
  const char *t = log->text ? log->text : "";
  size_t need = strlen(t) + 1;
  if (!text) {
    *size = need;
    return ZE_RESULT_SUCCESS;
  }
  if (*size < need)
    return ZE_RESULT_ERROR_INVALID_SIZE;
  memcpy(text, t, need);
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL f_log_destroy(ze_module_build_log_handle_t l) {
  free(((struct build_log *)l)->text);
  free(l);
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL f_global_pointer(ze_module_handle_t mh, const char *name, size_t *size, void **ptr) {
  struct module *m = (struct module *)mh;
  for (int g = 0; g < m->nglobals; ++g)
    if (!strcmp(m->global_names[g], name)) {
      if (size)
        *size = m->global_sizes[g];
      if (ptr)
        *ptr = m->global_ptrs[g];
      say("global %s %zu\n", name, m->global_sizes[g]);
      return ZE_RESULT_SUCCESS;
    }
  say("global-refused %s\n", name);
  return ZE_RESULT_ERROR_INVALID_GLOBAL_NAME;
}

struct kernel {
  struct module *m;
  int k;
  uint32_t group[3];
  int set[MAX_ARGS];
  size_t size[MAX_ARGS];
  unsigned char value[MAX_ARGS][8];
};

static ze_result_t ZE_APICALL f_kernel_create(ze_module_handle_t mh, const ze_kernel_desc_t *desc, ze_kernel_handle_t *out) {
  struct module *m = (struct module *)mh;
  if (!m || !desc || desc->stype != ZE_STRUCTURE_TYPE_KERNEL_DESC || !desc->pKernelName)
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  for (int k = 0; k < m->count; ++k)
    if (!strcmp(m->names[k], desc->pKernelName)) {
      struct kernel *kn = calloc(1, sizeof *kn);
      kn->m = m;
      kn->k = k;
      kn->group[0] = kn->group[1] = kn->group[2] = 1;
      *out = (ze_kernel_handle_t)kn;
      say("kernel %s %d\n", m->names[k], m->nargs[k]);
      return ZE_RESULT_SUCCESS;
    }
  say("kernel-refused %s\n", desc->pKernelName);
  return ZE_RESULT_ERROR_INVALID_KERNEL_NAME;
}

static ze_result_t ZE_APICALL f_kernel_destroy(ze_kernel_handle_t k) {
  free(k);
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL f_kernel_group(ze_kernel_handle_t kh, uint32_t x, uint32_t y, uint32_t z) {
  struct kernel *k = (struct kernel *)kh;
  if (!x || !y || !z || x > 1024 || y > 1024 || z > 1024 || (uint64_t)x * y * z > 1024) {
    say("group-refused %u,%u,%u\n", x, y, z);
    return ZE_RESULT_ERROR_INVALID_GROUP_SIZE_DIMENSION;
  }
  k->group[0] = x, k->group[1] = y, k->group[2] = z;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL f_kernel_arg(ze_kernel_handle_t kh, uint32_t i, size_t size, const void *value) {
  struct kernel *k = (struct kernel *)kh;
  if ((int)i >= k->m->nargs[k->k]) {
    say("arg-refused %s %u index\n", k->m->names[k->k], i);
    return ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_INDEX;
  }
  int local = (k->m->local_mask[k->k] >> i) & 1;
  size_t declared = k->m->arg_size[k->k][i];
  if (local ? (value != 0 || size == 0)
            : (value == 0 || (size != 4 && size != 8) || (declared && size != declared))) {
    say("arg-refused %s %u size=%zu value=%s\n", k->m->names[k->k], i, size, value ? "set" : "null");
    return ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_SIZE;
  }
  k->set[i] = 1;
  k->size[i] = size;
  memset(k->value[i], 0, 8);
  if (value)
    memcpy(k->value[i], value, size);
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL f_kernel_properties(ze_kernel_handle_t kh, ze_kernel_properties_t *p) {
  struct kernel *k = (struct kernel *)kh;
  if (!p || p->stype != ZE_STRUCTURE_TYPE_KERNEL_PROPERTIES)
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  p->numKernelArgs = (uint32_t)k->m->nargs[k->k];
  int fixed = !strcmp(k->m->names[k->k], "fixed_64");
  p->requiredGroupSizeX = fixed ? 64 : 0;
  p->requiredGroupSizeY = fixed ? 1 : 0;
  p->requiredGroupSizeZ = fixed ? 1 : 0;
  p->localMemSize = 0;
  /* 64 sub-groups of 16: 1024 work items; `heavy` (many registers) 16 of 16. */
  p->maxSubgroupSize = 16;
  p->maxNumSubgroups = !strcmp(k->m->names[k->k], "heavy") ? 16 : 64;
  return ZE_RESULT_SUCCESS;
}

/* ---- events --------------------------------------------------------------------------------- */

struct event_pool {
  uint32_t count;
  uint32_t flags;
};
struct event {
  int signalled;
  struct device *device;
  int host_waitable; /* a HOST_VISIBLE pool and a HOST signal scope */
};
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;

static ze_result_t ZE_APICALL f_pool_create(ze_context_handle_t c, const ze_event_pool_desc_t *desc, uint32_t n, ze_device_handle_t *devs, ze_event_pool_handle_t *out) {
  (void)n, (void)devs;
  NEED_CONTEXT(c);
  if (!desc || desc->stype != ZE_STRUCTURE_TYPE_EVENT_POOL_DESC || !desc->count)
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  struct event_pool *p = calloc(1, sizeof *p);
  p->count = desc->count;
  p->flags = desc->flags;
  *out = (ze_event_pool_handle_t)p;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL f_pool_destroy(ze_event_pool_handle_t p) {
  free(p);
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL f_event_create(ze_event_pool_handle_t ph, const ze_event_desc_t *desc, ze_event_handle_t *out) {
  struct event_pool *p = (struct event_pool *)ph;
  if (!p || !desc || desc->stype != ZE_STRUCTURE_TYPE_EVENT_DESC || desc->index >= p->count)
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  struct event *e = calloc(1, sizeof *e);
  e->host_waitable = (p->flags & ZE_EVENT_POOL_FLAG_HOST_VISIBLE) && (desc->signal & ZE_EVENT_SCOPE_FLAG_HOST);
  *out = (ze_event_handle_t)e;
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL f_event_destroy(ze_event_handle_t e) {
  free(e);
  return ZE_RESULT_SUCCESS;
}

/* FAKE_ZE_SYNC_GIVES_UP: the status the next host wait returns at once (0: none). */
static _Atomic int give_up_next_sync;

static int sync_give_up_status(const char *name) {
  const char *v = kernel_setting("FAKE_ZE_SYNC_GIVES_UP", name);
  return v ? (int)strtol(v, 0, 0) : 0;
}

static ze_result_t ZE_APICALL f_event_sync(ze_event_handle_t eh, uint64_t timeout) {
  struct event *e = (struct event *)eh;
  if (!e->host_waitable) {
    /* What the host may wait for is undefined for such an event on a real driver. */
    say("event-not-host-visible\n");
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  }
  int give_up = atomic_exchange(&give_up_next_sync, 0);
  if (give_up) {
    say("event-sync-gives-up %#x\n", (unsigned)give_up);
    return (ze_result_t)give_up;
  }
  struct timespec start;
  clock_gettime(CLOCK_MONOTONIC, &start);
  pthread_mutex_lock(&lock);
  for (;;) {
    if (e->device && e->device->lost) {
      pthread_mutex_unlock(&lock);
      return ZE_RESULT_ERROR_DEVICE_LOST;
    }
    if (e->signalled) {
      pthread_mutex_unlock(&lock);
      return ZE_RESULT_SUCCESS;
    }
    if (timeout != UINT64_MAX) {
      pthread_mutex_unlock(&lock);
      return ZE_RESULT_NOT_READY;
    }
    struct timespec now, until;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec - start.tv_sec > 60) {
      pthread_mutex_unlock(&lock);
      say("hang: waited a minute for an event that nothing signals\n");
      return ZE_RESULT_NOT_READY;
    }
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 1;
    pthread_cond_timedwait(&changed, &lock, &until);
  }
}

static ze_result_t ZE_APICALL f_event_reset(ze_event_handle_t eh) {
  pthread_mutex_lock(&lock);
  ((struct event *)eh)->signalled = 0;
  pthread_mutex_unlock(&lock);
  return ZE_RESULT_SUCCESS;
}

/* ---- immediate command lists: work runs later, in order, on the list's thread --------------- */

struct op {
  struct op *next;
  int type; /* 0 copy, 1 launch, 2 signal, 3 barrier (signalling `event` if set) */
  uintptr_t dst, src;
  size_t n;
  struct kernel snapshot;
  uint32_t groups[3];
  struct event *event;
  int hangs; /* FAKE_ZE_COPY_HANGS: held instead of run, until fake_ze_finish_held_copies */
};

/* The copies FAKE_ZE_COPY_HANGS held, and how many were appended (under `lock`). */
static struct op *held_copies;
static int hangs_appended, hangs_held;

/* A copy's bytes, if both sides are still there: one side may be the caller's pageable
 * memory; a side that was an allocation must still be one (the plugin keeps it until the list
 * has run). */
static void copy_now(struct op *o) {
  pthread_mutex_lock(&lock);
  int ok = inside(o->dst, o->n) || inside(o->src, o->n);
  pthread_mutex_unlock(&lock);
  if (!ok)
    say("use-after-free copy 0x%lx 0x%lx %zu\n", (unsigned long)o->dst, (unsigned long)o->src, o->n);
  else
    engine_copy((unsigned char *)o->dst, (const unsigned char *)o->src, o->n);
}

struct list {
  struct device *device;
  ze_context_handle_t context;
  _Atomic int appending; /* a thread is inside an append (immediate lists are not thread-safe) */
  pthread_t thread;
  pthread_cond_t work;
  struct op *head, *tail;
  int stop;
};

static void run_kernel(struct list *l, struct op *o) {
  struct kernel *k = &o->snapshot;
  const char *name = k->m->names[k->k];
  const char *fault = getenv("FAKE_ZE_FAULT");
  if (!strcmp(name, "fault") || (fault && !strcmp(name, fault))) {
    pthread_mutex_lock(&lock);
    l->device->lost = 1;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&lock);
    say("device-lost %s\n", name);
    return;
  }
  uint64_t items = (uint64_t)o->groups[0] * k->group[0];
  /* Every pointer argument (8 bytes, not __local) must still point into an allocation. */
  pthread_mutex_lock(&lock);
  for (int i = 0; i < k->m->nargs[k->k]; ++i) {
    uintptr_t p;
    memcpy(&p, k->value[i], 8);
    if (k->size[i] == 8 && !((k->m->local_mask[k->k] >> i) & 1) && p > 4096 && !inside(p, 1)) {
      pthread_mutex_unlock(&lock);
      say("use-after-free launch %s argument %d\n", name, i);
      return;
    }
  }
  pthread_mutex_unlock(&lock);
  int32_t n;
  memcpy(&n, k->value[0], 4);
  if (!strcmp(name, "saxpy") && k->m->nargs[k->k] == 4) {
    float a;
    float *x, *y;
    memcpy(&a, k->value[1], 4);
    memcpy(&x, k->value[2], 8);
    memcpy(&y, k->value[3], 8);
    for (uint64_t i = 0; i < items && i < (uint64_t)(n < 0 ? 0 : n); ++i)
      y[i] = a * x[i] + y[i];
  } else if (!strcmp(name, "add_k") && k->m->nargs[k->k] == 3) {
    uint32_t kk;
    uint32_t *x;
    memcpy(&kk, k->value[1], 4);
    memcpy(&x, k->value[2], 8);
    for (uint64_t i = 0; i < items && i < (uint64_t)(n < 0 ? 0 : n); ++i)
      x[i] += kk;
  } else if (!strcmp(name, "reverse") && k->m->nargs[k->k] == 3) {
    uint32_t *in, *out;
    memcpy(&in, k->value[0], 8);
    memcpy(&out, k->value[1], 8);
    uint32_t L = k->group[0];
    if (k->size[2] < L * 4) {
      say("local-too-small reverse %zu\n", k->size[2]);
      return;
    }
    for (uint32_t g = 0; g < o->groups[0]; ++g)
      for (uint32_t i = 0; i < L; ++i)
        out[g * L + i] = in[g * L + (L - 1 - i)];
  }
}

/* Runs one operation of `l` (the global lock not held). */
static void run_op(struct list *l, struct op *o, long delay) {
  pthread_mutex_lock(&lock);
  int lost = l->device->lost;
  pthread_mutex_unlock(&lock);
  if (delay > 0) {
    struct timespec t = {delay / 1000000, (delay % 1000000) * 1000};
    nanosleep(&t, 0);
  }
  if (!lost) {
    if (o->type == 0 && o->hangs) {
      say("copy-hangs 0x%lx 0x%lx %zu\n", (unsigned long)o->dst, (unsigned long)o->src, o->n);
      struct op *h = malloc(sizeof *h);
      *h = *o;
      pthread_mutex_lock(&lock);
      h->next = held_copies;
      held_copies = h;
      ++hangs_held;
      pthread_mutex_unlock(&lock);
    } else if (o->type == 0) {
      copy_now(o);
    } else if (o->type == 1) {
      run_kernel(l, o);
    }
  }
  pthread_mutex_lock(&lock);
  if ((o->type == 2 || o->type == 3) && o->event && !l->device->lost)
    o->event->signalled = 1;
  pthread_cond_broadcast(&changed);
  pthread_mutex_unlock(&lock);
}

/* The list's thread. Commands of a list are only guaranteed to start in order, not to finish in
 * order (the spec's "Execution Barriers"): the commands between two barriers form a segment
 * that is run once it is closed by a barrier, or once no command came for FAKE_ZE_IDLE_US
 * (default 2000), and it is run last command first, so a plugin that relies on completion
 * order without barriers gets wrong results (and a signal that is not a barrier fires before
 * the work appended ahead of it). A barrier runs after its segment and signals its event. */
static void *list_worker(void *arg) {
  struct list *l = arg;
  const char *e = getenv("FAKE_ZE_DELAY_US");
  long delay = e ? atol(e) : 20;
  const char *i = getenv("FAKE_ZE_IDLE_US");
  long idle = i ? atol(i) : 2000;
  pthread_mutex_lock(&lock);
  for (;;) {
    while (!l->head && !l->stop)
      pthread_cond_wait(&l->work, &lock);
    if (!l->head)
      break;
    /* The open segment: wait for its barrier, or for the appends to pause. */
    size_t n;
    for (;;) {
      struct op *end = l->head;
      n = 0;
      while (end && end->type != 3)
        end = end->next, ++n;
      if (end || l->stop)
        break;
      size_t before = n;
      struct timespec until;
      clock_gettime(CLOCK_REALTIME, &until);
      until.tv_nsec += (idle % 1000000) * 1000;
      until.tv_sec += idle / 1000000 + until.tv_nsec / 1000000000;
      until.tv_nsec %= 1000000000;
      pthread_cond_timedwait(&l->work, &lock, &until);
      size_t now = 0;
      struct op *o = l->head;
      while (o && o->type != 3)
        o = o->next, ++now;
      if (!o && now == before)
        break; /* no barrier, and nothing new came: the segment runs as it is */
    }
    /* Detach the segment (n commands) and the barrier after it, if any. */
    struct op **seg = n ? calloc(n, sizeof *seg) : 0;
    for (size_t k = 0; k < n; ++k) {
      seg[k] = l->head;
      l->head = l->head->next;
    }
    struct op *barrier = 0;
    if (l->head && l->head->type == 3) {
      barrier = l->head;
      l->head = barrier->next;
    }
    if (!l->head)
      l->tail = 0;
    pthread_mutex_unlock(&lock);
    for (size_t k = n; k-- > 0;) {
      run_op(l, seg[k], delay);
      free(seg[k]);
    }
    free(seg);
    if (barrier) {
      run_op(l, barrier, 0);
      free(barrier);
    }
    pthread_mutex_lock(&lock);
  }
  pthread_mutex_unlock(&lock);
  return 0;
}

/* Enters an append on `l`: a second thread inside one at the same time is said
 * ("concurrent-append"); the short sleep widens the window a missing lock leaves. */
static void enter_append(struct list *l) {
  if (atomic_exchange(&l->appending, 1))
    say("concurrent-append\n");
  struct timespec t = {0, 20000};
  nanosleep(&t, 0);
}

static void leave_append(struct list *l) { atomic_store(&l->appending, 0); }

/* Memory allocated in another context than the list's may not be used on it. */
static void check_context(struct list *l, uintptr_t p, size_t n, const char *what) {
  pthread_mutex_lock(&lock);
  struct allocation *a = inside(p, n ? n : 1);
  int other = a && a->context != l->context;
  pthread_mutex_unlock(&lock);
  if (other)
    say("wrong-context %s 0x%lx\n", what, (unsigned long)p);
}

static void enqueue(struct list *l, struct op *o) {
  pthread_mutex_lock(&lock);
  if (l->tail)
    l->tail->next = o;
  else
    l->head = o;
  l->tail = o;
  pthread_cond_signal(&l->work);
  pthread_mutex_unlock(&lock);
}

static ze_result_t ZE_APICALL f_list_immediate(ze_context_handle_t c, ze_device_handle_t d, const ze_command_queue_desc_t *desc, ze_command_list_handle_t *out) {
  NEED_CONTEXT(c);
  if (!is_device(d) || !desc || desc->stype != ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC)
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  if (desc->ordinal != 1) {
    say("list-refused ordinal %u is the copy-only group\n", desc->ordinal);
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  }
  struct list *l = calloc(1, sizeof *l);
  l->device = (struct device *)d;
  l->context = c;
  pthread_cond_init(&l->work, 0);
  pthread_create(&l->thread, 0, list_worker, l);
  *out = (ze_command_list_handle_t)l;
  say("list-create %u\n", desc->ordinal);
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL f_list_destroy(ze_command_list_handle_t lh) {
  struct list *l = (struct list *)lh;
  pthread_mutex_lock(&lock);
  l->stop = 1;
  pthread_cond_signal(&l->work);
  pthread_mutex_unlock(&lock);
  pthread_join(l->thread, 0);
  free(l);
  say("list-destroy\n");
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL f_append_copy(ze_command_list_handle_t lh, void *dst, const void *src, size_t n, ze_event_handle_t sig, uint32_t nw, ze_event_handle_t *waits) {
  (void)sig, (void)nw, (void)waits;
  struct list *l = (struct list *)lh;
  enter_append(l);
  check_context(l, (uintptr_t)dst, n, "copy");
  check_context(l, (uintptr_t)src, n, "copy");
  leave_append(l);
  pthread_mutex_lock(&lock);
  int known = inside((uintptr_t)dst, n) || inside((uintptr_t)src, n);
  pthread_mutex_unlock(&lock);
  if (!known) {
    say("bad-copy 0x%lx 0x%lx %zu\n", (unsigned long)(uintptr_t)dst, (unsigned long)(uintptr_t)src, n);
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  }
  struct op *o = calloc(1, sizeof *o);
  o->type = 0;
  o->dst = (uintptr_t)dst;
  o->src = (uintptr_t)src;
  o->n = n;
  /* FAKE_ZE_COPY_HANGS=N: a copy of N bytes hangs in the copy engine; the next host wait gives
   * up (ZE_RESULT_NOT_READY), and the copy may still write (fake_ze_finish_held_copies). */
  const char *hang = getenv("FAKE_ZE_COPY_HANGS");
  if (hang && (size_t)strtoull(hang, 0, 10) == n) {
    o->hangs = 1;
    pthread_mutex_lock(&lock);
    ++hangs_appended;
    pthread_mutex_unlock(&lock);
    atomic_store(&give_up_next_sync, ZE_RESULT_NOT_READY);
  }
  say("copy %zu\n", n);
  enqueue((struct list *)lh, o);
  return ZE_RESULT_SUCCESS;
}

/* For tests: runs the copies FAKE_ZE_COPY_HANGS held, now (a hung engine writing late), once
 * every such copy appended has reached the engine, and says how many there were. */
EXPORT int fake_ze_finish_held_copies(void) {
  pthread_mutex_lock(&lock);
  struct timespec start, now;
  clock_gettime(CLOCK_MONOTONIC, &start);
  while (hangs_held < hangs_appended) {
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec - start.tv_sec > 60) {
      say("hang: a held copy never reached the copy engine\n");
      break;
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 1;
    pthread_cond_timedwait(&changed, &lock, &until);
  }
  struct op *o = held_copies;
  held_copies = 0;
  pthread_mutex_unlock(&lock);
  int n = 0;
  while (o) {
    struct op *next = o->next;
    say("copy-finishes-late 0x%lx %zu\n", (unsigned long)o->dst, o->n);
    copy_now(o);
    free(o);
    o = next;
    ++n;
  }
  return n;
}

static ze_result_t ZE_APICALL f_append_launch(ze_command_list_handle_t lh, ze_kernel_handle_t kh, const ze_group_count_t *g, ze_event_handle_t sig, uint32_t nw, ze_event_handle_t *waits) {
  (void)sig, (void)nw, (void)waits;
  struct kernel *k = (struct kernel *)kh;
  struct list *l = (struct list *)lh;
  const char *name = k->m->names[k->k];
  enter_append(l);
  for (int i = 0; i < k->m->nargs[k->k]; ++i)
    if (k->set[i] && k->size[i] == 8 && !((k->m->local_mask[k->k] >> i) & 1)) {
      uintptr_t p;
      memcpy(&p, k->value[i], 8);
      check_context(l, p, 1, "launch");
    }
  leave_append(l);
  for (int i = 0; i < k->m->nargs[k->k]; ++i)
    if (!k->set[i]) {
      say("launch-refused %s argument %d not set\n", name, i);
      return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    }
  char line[4096];
  int at = snprintf(line, sizeof line, "launch %s groups=%u,%u,%u group=%u,%u,%u args=", name, g->groupCountX, g->groupCountY, g->groupCountZ, k->group[0], k->group[1], k->group[2]);
  for (int i = 0; i < k->m->nargs[k->k] && at < (int)sizeof line - 40; ++i) {
    if (i)
      line[at++] = ',';
    if ((k->m->local_mask[k->k] >> i) & 1)
      at += snprintf(line + at, sizeof line - (size_t)at, "local:%zu", k->size[i]);
    else
      for (size_t b = 0; b < k->size[i]; ++b)
        at += snprintf(line + at, sizeof line - (size_t)at, "%02x", k->value[i][b]);
  }
  say("%s\n", line);
  struct op *o = calloc(1, sizeof *o);
  o->type = 1;
  o->snapshot = *k;
  o->groups[0] = g->groupCountX, o->groups[1] = g->groupCountY, o->groups[2] = g->groupCountZ;
  enqueue((struct list *)lh, o);
  int give_up = sync_give_up_status(name);
  if (give_up)
    atomic_store(&give_up_next_sync, give_up);
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL f_append_signal(ze_command_list_handle_t lh, ze_event_handle_t eh) {
  struct list *l = (struct list *)lh;
  enter_append(l);
  leave_append(l);
  struct op *o = calloc(1, sizeof *o);
  o->type = 2;
  o->event = (struct event *)eh;
  o->event->device = l->device;
  enqueue(l, o);
  return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL f_append_barrier(ze_command_list_handle_t lh, ze_event_handle_t eh, uint32_t nw, ze_event_handle_t *waits) {
  struct list *l = (struct list *)lh;
  if (nw || waits) {
    say("barrier-refused waits on events are not modelled\n");
    return ZE_RESULT_ERROR_UNSUPPORTED_FEATURE;
  }
  enter_append(l);
  leave_append(l);
  struct op *o = calloc(1, sizeof *o);
  o->type = 3;
  o->event = (struct event *)eh;
  if (o->event)
    o->event->device = l->device;
  say("barrier%s\n", eh ? " signal" : "");
  enqueue(l, o);
  return ZE_RESULT_SUCCESS;
}

/* ---- the DDI tables the loader asks for ---------------------------------------------------- */

EXPORT ze_result_t ZE_APICALL zeGetGlobalProcAddrTable(ze_api_version_t v, ze_global_dditable_t *t) {
  (void)v;
  t->pfnInit = f_init;
  return ZE_RESULT_SUCCESS;
}

EXPORT ze_result_t ZE_APICALL zeGetDriverProcAddrTable(ze_api_version_t v, ze_driver_dditable_t *t) {
  (void)v;
  memset(t, 0, sizeof *t);
  t->pfnGet = f_driver_get;
  t->pfnGetApiVersion = f_driver_api_version;
  t->pfnGetProperties = f_driver_properties;
  return ZE_RESULT_SUCCESS;
}

EXPORT ze_result_t ZE_APICALL zeGetDeviceProcAddrTable(ze_api_version_t v, ze_device_dditable_t *t) {
  (void)v;
  memset(t, 0, sizeof *t);
  t->pfnGet = f_device_get;
  t->pfnGetProperties = f_device_properties;
  t->pfnGetComputeProperties = f_device_compute;
  t->pfnGetMemoryProperties = f_device_memory;
  t->pfnGetCommandQueueGroupProperties = f_device_queue_groups;
  return ZE_RESULT_SUCCESS;
}

EXPORT ze_result_t ZE_APICALL zeGetContextProcAddrTable(ze_api_version_t v, ze_context_dditable_t *t) {
  (void)v;
  memset(t, 0, sizeof *t);
  t->pfnCreate = f_context_create;
  t->pfnDestroy = f_context_destroy;
  return ZE_RESULT_SUCCESS;
}

EXPORT ze_result_t ZE_APICALL zeGetCommandListProcAddrTable(ze_api_version_t v, ze_command_list_dditable_t *t) {
  (void)v;
  memset(t, 0, sizeof *t);
  t->pfnCreateImmediate = f_list_immediate;
  t->pfnDestroy = f_list_destroy;
  t->pfnAppendMemoryCopy = f_append_copy;
  t->pfnAppendLaunchKernel = f_append_launch;
  t->pfnAppendSignalEvent = f_append_signal;
  t->pfnAppendBarrier = f_append_barrier;
  return ZE_RESULT_SUCCESS;
}

EXPORT ze_result_t ZE_APICALL zeGetEventPoolProcAddrTable(ze_api_version_t v, ze_event_pool_dditable_t *t) {
  (void)v;
  memset(t, 0, sizeof *t);
  t->pfnCreate = f_pool_create;
  t->pfnDestroy = f_pool_destroy;
  return ZE_RESULT_SUCCESS;
}

EXPORT ze_result_t ZE_APICALL zeGetEventProcAddrTable(ze_api_version_t v, ze_event_dditable_t *t) {
  (void)v;
  memset(t, 0, sizeof *t);
  t->pfnCreate = f_event_create;
  t->pfnDestroy = f_event_destroy;
  t->pfnHostSynchronize = f_event_sync;
  t->pfnHostReset = f_event_reset;
  return ZE_RESULT_SUCCESS;
}

EXPORT ze_result_t ZE_APICALL zeGetMemProcAddrTable(ze_api_version_t v, ze_mem_dditable_t *t) {
  (void)v;
  memset(t, 0, sizeof *t);
  t->pfnAllocDevice = f_alloc_device;
  t->pfnAllocHost = f_alloc_host;
  t->pfnAllocShared = f_alloc_shared;
  t->pfnFree = f_free;
  return ZE_RESULT_SUCCESS;
}

EXPORT ze_result_t ZE_APICALL zeGetModuleProcAddrTable(ze_api_version_t v, ze_module_dditable_t *t) {
  (void)v;
  memset(t, 0, sizeof *t);
  t->pfnCreate = f_module_create;
  t->pfnDestroy = f_module_destroy;
  t->pfnGetGlobalPointer = f_global_pointer;
  return ZE_RESULT_SUCCESS;
}

EXPORT ze_result_t ZE_APICALL zeGetModuleBuildLogProcAddrTable(ze_api_version_t v, ze_module_build_log_dditable_t *t) {
  (void)v;
  memset(t, 0, sizeof *t);
  t->pfnGetString = f_log_string;
  t->pfnDestroy = f_log_destroy;
  return ZE_RESULT_SUCCESS;
}

EXPORT ze_result_t ZE_APICALL zeGetKernelProcAddrTable(ze_api_version_t v, ze_kernel_dditable_t *t) {
  (void)v;
  memset(t, 0, sizeof *t);
  t->pfnCreate = f_kernel_create;
  t->pfnDestroy = f_kernel_destroy;
  t->pfnSetGroupSize = f_kernel_group;
  t->pfnSetArgumentValue = f_kernel_arg;
  t->pfnGetProperties = f_kernel_properties;
  return ZE_RESULT_SUCCESS;
}

/* The tables the plugin does not use, which the loader requires all the same: left as the
 * loader zeroed them (a call through one is ZE_RESULT_ERROR_UNSUPPORTED_FEATURE). */
#define UNUSED_ZE_TABLE(name, type)                                                              \
  EXPORT ze_result_t ZE_APICALL name(ze_api_version_t v, type *t) {                              \
    (void)v, (void)t;                                                                            \
    return ZE_RESULT_SUCCESS;                                                                    \
  }
UNUSED_ZE_TABLE(zeGetCommandQueueProcAddrTable, ze_command_queue_dditable_t)
UNUSED_ZE_TABLE(zeGetFenceProcAddrTable, ze_fence_dditable_t)
UNUSED_ZE_TABLE(zeGetImageProcAddrTable, ze_image_dditable_t)
UNUSED_ZE_TABLE(zeGetPhysicalMemProcAddrTable, ze_physical_mem_dditable_t)
UNUSED_ZE_TABLE(zeGetSamplerProcAddrTable, ze_sampler_dditable_t)
UNUSED_ZE_TABLE(zeGetVirtualMemProcAddrTable, ze_virtual_mem_dditable_t)
/* zet and zes tables: their headers are not included, so the table is untyped here. */
#define UNUSED_TABLE(name) UNUSED_ZE_TABLE(name, void)
UNUSED_TABLE(zetGetDeviceProcAddrTable)
UNUSED_TABLE(zetGetContextProcAddrTable)
UNUSED_TABLE(zetGetCommandListProcAddrTable)
UNUSED_TABLE(zetGetKernelProcAddrTable)
UNUSED_TABLE(zetGetModuleProcAddrTable)
UNUSED_TABLE(zetGetDebugProcAddrTable)
UNUSED_TABLE(zetGetMetricProcAddrTable)
UNUSED_TABLE(zetGetMetricGroupProcAddrTable)
UNUSED_TABLE(zetGetMetricQueryProcAddrTable)
UNUSED_TABLE(zetGetMetricQueryPoolProcAddrTable)
UNUSED_TABLE(zetGetMetricStreamerProcAddrTable)
UNUSED_TABLE(zetGetTracerExpProcAddrTable)
UNUSED_TABLE(zesGetDeviceProcAddrTable)
UNUSED_TABLE(zesGetDriverProcAddrTable)
UNUSED_TABLE(zesGetDiagnosticsProcAddrTable)
UNUSED_TABLE(zesGetEngineProcAddrTable)
UNUSED_TABLE(zesGetFabricPortProcAddrTable)
UNUSED_TABLE(zesGetFanProcAddrTable)
UNUSED_TABLE(zesGetFirmwareProcAddrTable)
UNUSED_TABLE(zesGetFrequencyProcAddrTable)
UNUSED_TABLE(zesGetLedProcAddrTable)
UNUSED_TABLE(zesGetMemoryProcAddrTable)
UNUSED_TABLE(zesGetPerformanceFactorProcAddrTable)
UNUSED_TABLE(zesGetPowerProcAddrTable)
UNUSED_TABLE(zesGetPsuProcAddrTable)
UNUSED_TABLE(zesGetRasProcAddrTable)
UNUSED_TABLE(zesGetSchedulerProcAddrTable)
UNUSED_TABLE(zesGetStandbyProcAddrTable)
UNUSED_TABLE(zesGetTemperatureProcAddrTable)
