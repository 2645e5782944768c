/* An HSA runtime without a GPU, for testing the amdgpu plugin up to the runtime boundary
 * (tests/tests/amdgpu_fake_runtime.rs builds it against the real ROCm headers and points
 * OFFLOAD_HSA_RUNTIME at it).
 *
 * One CPU agent and one GPU agent (ISA name from FAKE_HSA_ISA, default
 * "amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-"), a coarse-grained device pool, a fine-grained
 * host pool and a kernarg pool. It keeps the contracts a plugin can break, and says when it does
 * (a line in FAKE_HSA_LOG):
 *   - memory is host memory it tracks: copies must stay inside allocations or locked ranges
 *     ("bad-copy"), frees must name a live allocation ("bad-free"), host-pool memory must be
 *     made accessible to the GPU before a dispatch uses it as kernel arguments ("no-access");
 *   - a dispatch packet must be published with a valid header, in a reserved slot, before the
 *     doorbell is rung ("bad-packet");
 *   - kernels are found by their descriptor symbol (`name.kd`) in the code object's bytes.
 * Dispatches do not run: each is logged with its shape, its segment sizes and every byte of its
 * kernel arguments, then its completion signal is decremented. */

#include <hsa.h>
#include <hsa_ext_amd.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialised;

static void say(const char *fmt, ...) {
  const char *path = getenv("FAKE_HSA_LOG");
  if (!path)
    return;
  pthread_mutex_lock(&lock);
  FILE *f = fopen(path, "a");
  if (f) {
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fclose(f);
  }
  pthread_mutex_unlock(&lock);
}

enum { CPU = 1, GPU = 2 };
enum { POOL_DEVICE = 11, POOL_HOST = 12, POOL_KERNARG = 13 };
#define ISA_HANDLE 21

/* ---- status strings --------------------------------------------------------------------- */

hsa_status_t hsa_status_string(hsa_status_t s, const char **text) {
  switch (s) {
  case HSA_STATUS_SUCCESS: *text = "HSA_STATUS_SUCCESS: The function has been executed successfully."; break;
  case HSA_STATUS_ERROR_INVALID_ARGUMENT: *text = "HSA_STATUS_ERROR_INVALID_ARGUMENT: One of the actual arguments does not meet a precondition stated in the documentation of the corresponding formal argument."; break;
  case HSA_STATUS_ERROR_OUT_OF_RESOURCES: *text = "HSA_STATUS_ERROR_OUT_OF_RESOURCES: The runtime failed to allocate the necessary resources."; break;
  case HSA_STATUS_ERROR_INVALID_CODE_OBJECT: *text = "HSA_STATUS_ERROR_INVALID_CODE_OBJECT: The code object is invalid."; break;
  case HSA_STATUS_ERROR_INVALID_SYMBOL_NAME: *text = "HSA_STATUS_ERROR_INVALID_SYMBOL_NAME: There is no symbol with the given name."; break;
  case HSA_STATUS_ERROR_NOT_INITIALIZED: *text = "HSA_STATUS_ERROR_NOT_INITIALIZED: An API other than hsa_init has been invoked while the reference count of the HSA runtime is zero."; break;
  default: return HSA_STATUS_ERROR_INVALID_ARGUMENT;
  }
  return HSA_STATUS_SUCCESS;
}

#define NEED_INIT                                                                                \
  do {                                                                                           \
    if (!initialised)                                                                            \
      return HSA_STATUS_ERROR_NOT_INITIALIZED;                                                   \
  } while (0)

hsa_status_t hsa_init(void) {
  if (getenv("FAKE_HSA_INIT_FAILS"))
    return HSA_STATUS_ERROR_OUT_OF_RESOURCES;
  initialised = 1;
  return HSA_STATUS_SUCCESS;
}

hsa_status_t hsa_shut_down(void) { return HSA_STATUS_SUCCESS; }

/* ---- agents and pools --------------------------------------------------------------------- */

hsa_status_t hsa_iterate_agents(hsa_status_t (*cb)(hsa_agent_t, void *), void *data) {
  NEED_INIT;
  hsa_agent_t cpu = {CPU}, gpu = {GPU};
  hsa_status_t s = cb(cpu, data);
  if (s == HSA_STATUS_SUCCESS && !getenv("FAKE_HSA_NO_GPU"))
    s = cb(gpu, data);
  return s == HSA_STATUS_INFO_BREAK ? HSA_STATUS_SUCCESS : s;
}

static const char *isa(void) {
  const char *e = getenv("FAKE_HSA_ISA");
  return e ? e : "amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-";
}

hsa_status_t hsa_agent_get_info(hsa_agent_t agent, hsa_agent_info_t attribute, void *value) {
  NEED_INIT;
  if (agent.handle != CPU && agent.handle != GPU)
    return HSA_STATUS_ERROR_INVALID_AGENT;
  int gpu = agent.handle == GPU;
  switch ((int)attribute) {
  case HSA_AGENT_INFO_NAME: {
    char name[64] = {0};
    const char *p = strstr(isa(), "--");
    snprintf(name, sizeof name, "%s", gpu ? (p ? p + 2 : isa()) : "Fake CPU");
    char *colon = strchr(name, ':');
    if (colon)
      *colon = 0;
    memcpy(value, name, 64);
    break;
  }
  case HSA_AMD_AGENT_INFO_PRODUCT_NAME: {
    char name[64] = {0};
    snprintf(name, sizeof name, "%s", gpu ? "Fake AMD GPU" : "Fake CPU");
    memcpy(value, name, 64);
    break;
  }
  case HSA_AGENT_INFO_DEVICE: *(hsa_device_type_t *)value = gpu ? HSA_DEVICE_TYPE_GPU : HSA_DEVICE_TYPE_CPU; break;
  case HSA_AGENT_INFO_WAVEFRONT_SIZE: *(uint32_t *)value = 64; break;
  case HSA_AGENT_INFO_WORKGROUP_MAX_SIZE: *(uint32_t *)value = 1024; break;
  case HSA_AGENT_INFO_WORKGROUP_MAX_DIM: {
    uint16_t d[3] = {1024, 1024, 1024};
    memcpy(value, d, sizeof d);
    break;
  }
  case HSA_AGENT_INFO_GRID_MAX_DIM: {
    uint32_t d[3] = {0xffffffffu, 0xffffffffu, 0xffffffffu};
    memcpy(value, d, sizeof d);
    break;
  }
  case HSA_AMD_AGENT_INFO_COMPUTE_UNIT_COUNT: *(uint32_t *)value = 110; break;
  case HSA_AGENT_INFO_QUEUE_MAX_SIZE: *(uint32_t *)value = 131072; break;
  default: return HSA_STATUS_ERROR_INVALID_ARGUMENT;
  }
  return HSA_STATUS_SUCCESS;
}

hsa_status_t hsa_agent_iterate_isas(hsa_agent_t agent, hsa_status_t (*cb)(hsa_isa_t, void *), void *data) {
  NEED_INIT;
  if (agent.handle != GPU)
    return HSA_STATUS_ERROR_INVALID_AGENT;
  hsa_isa_t i = {ISA_HANDLE};
  hsa_status_t s = cb(i, data);
  return s == HSA_STATUS_INFO_BREAK ? HSA_STATUS_SUCCESS : s;
}

hsa_status_t hsa_isa_get_info_alt(hsa_isa_t i, hsa_isa_info_t attribute, void *value) {
  NEED_INIT;
  if (i.handle != ISA_HANDLE)
    return HSA_STATUS_ERROR_INVALID_ISA;
  if (attribute == HSA_ISA_INFO_NAME_LENGTH)
    *(uint32_t *)value = (uint32_t)strlen(isa());
  else if (attribute == HSA_ISA_INFO_NAME)
    memcpy(value, isa(), strlen(isa()));
  else
    return HSA_STATUS_ERROR_INVALID_ARGUMENT;
  return HSA_STATUS_SUCCESS;
}

hsa_status_t hsa_amd_agent_iterate_memory_pools(hsa_agent_t agent, hsa_status_t (*cb)(hsa_amd_memory_pool_t, void *), void *data) {
  NEED_INIT;
  hsa_amd_memory_pool_t pools[2];
  int n = 0;
  if (agent.handle == GPU) {
    pools[n++].handle = POOL_DEVICE;
  } else {
    pools[n++].handle = POOL_HOST;
    pools[n++].handle = POOL_KERNARG;
  }
  for (int i = 0; i < n; ++i) {
    hsa_status_t s = cb(pools[i], data);
    if (s == HSA_STATUS_INFO_BREAK)
      return HSA_STATUS_SUCCESS;
    if (s != HSA_STATUS_SUCCESS)
      return s;
  }
  return HSA_STATUS_SUCCESS;
}

hsa_status_t hsa_amd_memory_pool_get_info(hsa_amd_memory_pool_t pool, hsa_amd_memory_pool_info_t attribute, void *value) {
  NEED_INIT;
  switch ((int)attribute) {
  case HSA_AMD_MEMORY_POOL_INFO_SEGMENT: *(hsa_amd_segment_t *)value = HSA_AMD_SEGMENT_GLOBAL; break;
  case HSA_AMD_MEMORY_POOL_INFO_GLOBAL_FLAGS:
    *(uint32_t *)value = pool.handle == POOL_DEVICE ? HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_COARSE_GRAINED
                         : pool.handle == POOL_HOST ? HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_FINE_GRAINED
                                                    : HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_KERNARG_INIT;
    break;
  case HSA_AMD_MEMORY_POOL_INFO_SIZE: *(size_t *)value = pool.handle == POOL_DEVICE ? (size_t)64 << 30 : (size_t)256 << 30; break;
  case HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_ALLOWED: *(bool *)value = true; break;
  default: return HSA_STATUS_ERROR_INVALID_ARGUMENT;
  }
  return HSA_STATUS_SUCCESS;
}

/* ---- memory ------------------------------------------------------------------------------- */

struct allocation {
  uintptr_t base;
  size_t size;
  uint64_t pool;
  int gpu_access; /* host pools: allowed for the GPU */
  int locked;     /* a locked host range, not an allocation */
};
static struct allocation allocations[65536];

static struct allocation *find(uintptr_t p, size_t n) {
  for (int i = 0; i < 65536; ++i)
    if (allocations[i].base && p >= allocations[i].base && p + n <= allocations[i].base + allocations[i].size)
      return &allocations[i];
  return 0;
}

static struct allocation *track(uintptr_t base, size_t size, uint64_t pool, int locked) {
  for (int i = 0; i < 65536; ++i)
    if (!allocations[i].base) {
      allocations[i] = (struct allocation){base, size, pool, pool == POOL_DEVICE, locked};
      return &allocations[i];
    }
  return 0;
}

hsa_status_t hsa_amd_memory_pool_allocate(hsa_amd_memory_pool_t pool, size_t size, uint32_t flags, void **ptr) {
  (void)flags;
  NEED_INIT;
  const char *limit = getenv("FAKE_HSA_MEMORY");
  if (size == 0)
    return HSA_STATUS_ERROR_INVALID_ALLOCATION;
  if (pool.handle == POOL_DEVICE && limit && size > strtoull(limit, 0, 10))
    return HSA_STATUS_ERROR_OUT_OF_RESOURCES;
  void *p = calloc(1, size);
  pthread_mutex_lock(&lock);
  struct allocation *a = p ? track((uintptr_t)p, size, pool.handle, 0) : 0;
  pthread_mutex_unlock(&lock);
  if (!a) {
    free(p);
    return HSA_STATUS_ERROR_OUT_OF_RESOURCES;
  }
  *ptr = p;
  say("alloc %lu 0x%lx %zu\n", (unsigned long)pool.handle, (unsigned long)(uintptr_t)p, size);
  return HSA_STATUS_SUCCESS;
}

hsa_status_t hsa_amd_memory_pool_free(void *ptr) {
  NEED_INIT;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < 65536; ++i)
    if (allocations[i].base == (uintptr_t)ptr && !allocations[i].locked) {
      uint64_t pool = allocations[i].pool;
      allocations[i].base = 0;
      pthread_mutex_unlock(&lock);
      free(ptr);
      say("free %lu 0x%lx\n", (unsigned long)pool, (unsigned long)(uintptr_t)ptr);
      return HSA_STATUS_SUCCESS;
    }
  pthread_mutex_unlock(&lock);
  say("bad-free 0x%lx\n", (unsigned long)(uintptr_t)ptr);
  return HSA_STATUS_ERROR_INVALID_ARGUMENT;
}

hsa_status_t hsa_amd_agents_allow_access(uint32_t n, const hsa_agent_t *agents, const uint32_t *flags, const void *ptr) {
  (void)flags;
  NEED_INIT;
  pthread_mutex_lock(&lock);
  struct allocation *a = find((uintptr_t)ptr, 1);
  if (a)
    for (uint32_t i = 0; i < n; ++i)
      if (agents[i].handle == GPU)
        a->gpu_access = 1;
  pthread_mutex_unlock(&lock);
  return a ? HSA_STATUS_SUCCESS : HSA_STATUS_ERROR_INVALID_ARGUMENT;
}

hsa_status_t hsa_amd_memory_lock(void *host, size_t size, hsa_agent_t *agents, int n, void **agent_ptr) {
  (void)agents, (void)n;
  NEED_INIT;
  pthread_mutex_lock(&lock);
  struct allocation *a = track((uintptr_t)host, size, POOL_HOST, 1);
  if (a)
    a->gpu_access = 1;
  pthread_mutex_unlock(&lock);
  *agent_ptr = host;
  return a ? HSA_STATUS_SUCCESS : HSA_STATUS_ERROR_OUT_OF_RESOURCES;
}

hsa_status_t hsa_amd_memory_unlock(void *host) {
  NEED_INIT;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < 65536; ++i)
    if (allocations[i].base == (uintptr_t)host && allocations[i].locked) {
      allocations[i].base = 0;
      pthread_mutex_unlock(&lock);
      return HSA_STATUS_SUCCESS;
    }
  pthread_mutex_unlock(&lock);
  say("bad-unlock 0x%lx\n", (unsigned long)(uintptr_t)host);
  return HSA_STATUS_ERROR_INVALID_ARGUMENT;
}

/* ---- signals ------------------------------------------------------------------------------ */

struct signal {
  _Atomic int64_t value;
  struct queue *doorbell_of;
};

hsa_status_t hsa_signal_create(hsa_signal_value_t initial, uint32_t n, const hsa_agent_t *consumers, hsa_signal_t *signal) {
  (void)n, (void)consumers;
  NEED_INIT;
  struct signal *s = calloc(1, sizeof *s);
  atomic_store(&s->value, initial);
  signal->handle = (uint64_t)(uintptr_t)s;
  return HSA_STATUS_SUCCESS;
}

hsa_status_t hsa_signal_destroy(hsa_signal_t signal) {
  NEED_INIT;
  if (!signal.handle)
    return HSA_STATUS_ERROR_INVALID_SIGNAL;
  free((void *)(uintptr_t)signal.handle);
  return HSA_STATUS_SUCCESS;
}

hsa_signal_value_t hsa_signal_wait_scacquire(hsa_signal_t signal, hsa_signal_condition_t cond, hsa_signal_value_t compare, uint64_t timeout, hsa_wait_state_t state) {
  (void)timeout, (void)state;
  struct signal *s = (struct signal *)(uintptr_t)signal.handle;
  /* Work completes synchronously here: the value is final. A wait that would never end is a
     plugin that rang no doorbell or published no packet: say so and stop the test process. */
  hsa_signal_value_t v = atomic_load(&s->value);
  int met = cond == HSA_SIGNAL_CONDITION_LT ? v < compare : cond == HSA_SIGNAL_CONDITION_EQ ? v == compare : 1;
  if (!met) {
    say("hang: waiting for a signal at %ld that nothing will change\n", (long)v);
    abort();
  }
  return v;
}

/* ---- queues ------------------------------------------------------------------------------- */

struct queue {
  hsa_queue_t q; /* first: the plugin reads it */
  _Atomic uint64_t write_index;
  _Atomic uint64_t read_index;
  struct signal doorbell;
};

struct code_object {
  unsigned char *bytes;
  size_t size;
};

struct kernel_symbol {
  char name[256];
};

static void process(struct queue *q, uint64_t upto) {
  while (atomic_load(&q->read_index) <= upto) {
    uint64_t index = atomic_load(&q->read_index);
    hsa_kernel_dispatch_packet_t *p = (hsa_kernel_dispatch_packet_t *)q->q.base_address + (index % q->q.size);
    uint16_t type = (p->header >> HSA_PACKET_HEADER_TYPE) & 0xff;
    if (type != HSA_PACKET_TYPE_KERNEL_DISPATCH) {
      say("bad-packet header %#x at %lu\n", p->header, (unsigned long)index);
      atomic_store(&q->read_index, index + 1);
      continue;
    }
    struct kernel_symbol *k = (struct kernel_symbol *)(uintptr_t)p->kernel_object;
    pthread_mutex_lock(&lock);
    struct allocation *args = find((uintptr_t)p->kernarg_address, 1);
    int access = args && args->gpu_access;
    size_t size = args ? args->size : 0;
    pthread_mutex_unlock(&lock);
    if (!args || args->pool != POOL_KERNARG)
      say("bad-packet kernarg 0x%lx is not a kernarg allocation\n", (unsigned long)p->kernarg_address);
    if (!access)
      say("no-access kernarg 0x%lx\n", (unsigned long)p->kernarg_address);
    char line[16384];
    int at = snprintf(line, sizeof line, "dispatch %s dims=%u grid=%u,%u,%u wg=%u,%u,%u group=%u private=%u %s kernarg=",
                      k ? k->name : "?", p->setup & 3, p->grid_size_x, p->grid_size_y, p->grid_size_z,
                      p->workgroup_size_x, p->workgroup_size_y, p->workgroup_size_z, p->group_segment_size,
                      p->private_segment_size, (p->header >> HSA_PACKET_HEADER_BARRIER) & 1 ? "barrier" : "nobarrier");
    for (size_t b = 0; b < size && at < (int)sizeof line - 4; ++b)
      at += snprintf(line + at, sizeof line - (size_t)at, "%02x", ((unsigned char *)(uintptr_t)p->kernarg_address)[b]);
    say("%s\n", line);
    p->header = HSA_PACKET_TYPE_INVALID;
    atomic_store(&q->read_index, index + 1);
    if (p->completion_signal.handle)
      atomic_fetch_sub(&((struct signal *)(uintptr_t)p->completion_signal.handle)->value, 1);
  }
}

hsa_status_t hsa_queue_create(hsa_agent_t agent, uint32_t size, hsa_queue_type32_t type, void (*callback)(hsa_status_t, hsa_queue_t *, void *), void *data, uint32_t private_size, uint32_t group_size, hsa_queue_t **out) {
  (void)type, (void)callback, (void)data, (void)private_size, (void)group_size;
  NEED_INIT;
  if (agent.handle != GPU || size == 0 || (size & (size - 1)))
    return HSA_STATUS_ERROR_INVALID_ARGUMENT;
  struct queue *q = calloc(1, sizeof *q);
  q->q.base_address = calloc(size, 64);
  for (uint32_t i = 0; i < size; ++i)
    ((hsa_kernel_dispatch_packet_t *)q->q.base_address)[i].header = HSA_PACKET_TYPE_INVALID;
  q->q.size = size;
  q->doorbell.doorbell_of = q;
  q->q.doorbell_signal.handle = (uint64_t)(uintptr_t)&q->doorbell;
  *out = &q->q;
  say("queue-create %u\n", size);
  return HSA_STATUS_SUCCESS;
}

hsa_status_t hsa_queue_destroy(hsa_queue_t *queue) {
  NEED_INIT;
  struct queue *q = (struct queue *)queue;
  free(q->q.base_address);
  free(q);
  say("queue-destroy\n");
  return HSA_STATUS_SUCCESS;
}

uint64_t hsa_queue_add_write_index_relaxed(const hsa_queue_t *queue, uint64_t value) {
  return atomic_fetch_add(&((struct queue *)queue)->write_index, value);
}

uint64_t hsa_queue_load_read_index_scacquire(const hsa_queue_t *queue) {
  return atomic_load(&((struct queue *)queue)->read_index);
}

void hsa_signal_store_relaxed(hsa_signal_t signal, hsa_signal_value_t value) {
  struct signal *s = (struct signal *)(uintptr_t)signal.handle;
  atomic_store(&s->value, value);
  if (s->doorbell_of) {
    if ((uint64_t)value >= atomic_load(&s->doorbell_of->write_index))
      say("bad-packet doorbell %ld beyond the reserved slots\n", (long)value);
    else
      process(s->doorbell_of, (uint64_t)value);
  }
}

void hsa_signal_store_screlease(hsa_signal_t signal, hsa_signal_value_t value) { hsa_signal_store_relaxed(signal, value); }

/* ---- copies ------------------------------------------------------------------------------- */

/* A DMA engine promises nothing for overlapping ranges; this one copies in the direction that
 * gets memmove's result wrong, and says so ("overlapping-copy"). */
static void engine_copy(unsigned char *dst, const unsigned char *src, size_t n) {
  if (dst < src + n && src < dst + n && dst != src) {
    say("overlapping-copy 0x%lx 0x%lx %zu\n", (unsigned long)(uintptr_t)dst,
        (unsigned long)(uintptr_t)src, n);
    if (dst > src)
      for (size_t i = 0; i < n; ++i)
        dst[i] = src[i];
    else
      for (size_t i = n; i-- > 0;)
        dst[i] = src[i];
    return;
  }
  memcpy(dst, src, n);
}

hsa_status_t hsa_amd_memory_async_copy(void *dst, hsa_agent_t dst_agent, const void *src, hsa_agent_t src_agent, size_t size, uint32_t n, const hsa_signal_t *deps, hsa_signal_t completion) {
  (void)dst_agent, (void)src_agent, (void)n, (void)deps;
  NEED_INIT;
  pthread_mutex_lock(&lock);
  int ok = find((uintptr_t)dst, size) && find((uintptr_t)src, size);
  pthread_mutex_unlock(&lock);
  if (!ok) {
    say("bad-copy 0x%lx 0x%lx %zu\n", (unsigned long)(uintptr_t)dst, (unsigned long)(uintptr_t)src, size);
    return HSA_STATUS_ERROR_INVALID_ARGUMENT;
  }
  engine_copy(dst, src, size);
  say("copy %zu\n", size);
  atomic_fetch_sub(&((struct signal *)(uintptr_t)completion.handle)->value, 1);
  return HSA_STATUS_SUCCESS;
}

/* ---- code objects and executables --------------------------------------------------------- */

hsa_status_t hsa_code_object_reader_create_from_memory(const void *code_object, size_t size, hsa_code_object_reader_t *reader) {
  NEED_INIT;
  if (size < 64 || memcmp(code_object, "\x7f" "ELF", 4))
    return HSA_STATUS_ERROR_INVALID_CODE_OBJECT;
  struct code_object *c = malloc(sizeof *c);
  c->bytes = malloc(size);
  memcpy(c->bytes, code_object, size);
  c->size = size;
  reader->handle = (uint64_t)(uintptr_t)c;
  say("reader %zu\n", size);
  return HSA_STATUS_SUCCESS;
}

hsa_status_t hsa_code_object_reader_destroy(hsa_code_object_reader_t reader) {
  NEED_INIT;
  struct code_object *c = (struct code_object *)(uintptr_t)reader.handle;
  free(c->bytes);
  free(c);
  say("reader-destroy\n");
  return HSA_STATUS_SUCCESS;
}

struct executable {
  struct code_object *code;
  int frozen;
};

hsa_status_t hsa_executable_create_alt(hsa_profile_t profile, hsa_default_float_rounding_mode_t rounding, const char *options, hsa_executable_t *executable) {
  (void)profile, (void)rounding, (void)options;
  NEED_INIT;
  executable->handle = (uint64_t)(uintptr_t)calloc(1, sizeof(struct executable));
  return HSA_STATUS_SUCCESS;
}

hsa_status_t hsa_executable_load_agent_code_object(hsa_executable_t executable, hsa_agent_t agent, hsa_code_object_reader_t reader, const char *options, hsa_loaded_code_object_t *loaded) {
  (void)options, (void)loaded;
  NEED_INIT;
  if (agent.handle != GPU)
    return HSA_STATUS_ERROR_INVALID_AGENT;
  ((struct executable *)(uintptr_t)executable.handle)->code = (struct code_object *)(uintptr_t)reader.handle;
  say("load\n");
  return HSA_STATUS_SUCCESS;
}

hsa_status_t hsa_executable_freeze(hsa_executable_t executable, const char *options) {
  (void)options;
  NEED_INIT;
  ((struct executable *)(uintptr_t)executable.handle)->frozen = 1;
  return HSA_STATUS_SUCCESS;
}

hsa_status_t hsa_executable_destroy(hsa_executable_t executable) {
  NEED_INIT;
  free((void *)(uintptr_t)executable.handle);
  say("unload\n");
  return HSA_STATUS_SUCCESS;
}

hsa_status_t hsa_executable_get_symbol_by_name(hsa_executable_t executable, const char *name, const hsa_agent_t *agent, hsa_executable_symbol_t *symbol) {
  (void)agent;
  NEED_INIT;
  struct executable *e = (struct executable *)(uintptr_t)executable.handle;
  if (!e->frozen || !e->code)
    return HSA_STATUS_ERROR_INVALID_EXECUTABLE;
  size_t n = strlen(name) + 1; /* with the NUL of the string table */
  for (size_t i = 0; n < 256 && i + n <= e->code->size; ++i)
    if (!memcmp(e->code->bytes + i, name, n) && (i == 0 || !e->code->bytes[i - 1])) {
      struct kernel_symbol *k = calloc(1, sizeof *k);
      memcpy(k->name, name, n);
      char *dot = strstr(k->name, ".kd");
      if (dot)
        *dot = 0;
      symbol->handle = (uint64_t)(uintptr_t)k;
      return HSA_STATUS_SUCCESS;
    }
  return HSA_STATUS_ERROR_INVALID_SYMBOL_NAME;
}

hsa_status_t hsa_executable_symbol_get_info(hsa_executable_symbol_t symbol, hsa_executable_symbol_info_t attribute, void *value) {
  NEED_INIT;
  switch ((int)attribute) {
  case HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_OBJECT: *(uint64_t *)value = symbol.handle; break;
  case HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_SIZE:
  case HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_GROUP_SEGMENT_SIZE:
  case HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_PRIVATE_SEGMENT_SIZE: *(uint32_t *)value = 0; break;
  default: return HSA_STATUS_ERROR_INVALID_ARGUMENT;
  }
  return HSA_STATUS_SUCCESS;
}
