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
 *   - work is asynchronous: a queue's packets run on its own thread and copies on a DMA thread,
 *     later than they were submitted, each completion signal decremented when done, so a
 *     missing wait or memory freed under queued work shows ("use-after-free", wrong reads);
 *   - memory the runtime allocated cannot be locked ("lock-of-hsa-memory", as ROCr), nor
 *     read-only pages ("lock-refused", as the kernel driver registers host memory for writing);
 *   - faults as ROCr reports them: FAKE_HSA_FAULT=name:memory calls the system event handlers
 *     and aborts the process unless one returns success; name:queue calls the queue's error
 *     callback; more than 64 KiB of LDS is a queue error; a stopped queue completes nothing;
 *     FAKE_HSA_COPY_HANGS=N faults the GPU on a copy of N bytes and holds the copy, which runs
 *     (writes late) when the test calls fake_hsa_finish_held_copies.
 * Each dispatch is logged with its shape, its segment sizes and every byte of its kernel
 * arguments; most kernels then do nothing, add_k computes (run_dispatch). */

#include <hsa.h>
#include <hsa_ext_amd.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialised;

#define FAKE_LOG_VARIABLE "FAKE_HSA_LOG"
#include "../fake-common/fake_common.h"

enum { CPU = 1, GPU = 2 };
enum { POOL_DEVICE = 11, POOL_HOST = 12, POOL_KERNARG = 13, POOL_GROUP = 14 };
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
  case HSA_AGENT_INFO_FEATURE:
    *(hsa_agent_feature_t *)value = gpu && !getenv("FAKE_HSA_NO_DISPATCH") ? HSA_AGENT_FEATURE_KERNEL_DISPATCH : HSA_AGENT_FEATURE_AGENT_DISPATCH;
    break;
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
  hsa_amd_memory_pool_t pools[3];
  int n = 0;
  if (agent.handle == GPU) {
    pools[n++].handle = POOL_GROUP;
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
  if (pool.handle == POOL_GROUP) {
    /* The LDS of a work-group: 64 KiB, not for allocation. */
    switch ((int)attribute) {
    case HSA_AMD_MEMORY_POOL_INFO_SEGMENT: *(hsa_amd_segment_t *)value = HSA_AMD_SEGMENT_GROUP; return HSA_STATUS_SUCCESS;
    case HSA_AMD_MEMORY_POOL_INFO_SIZE: *(size_t *)value = 65536; return HSA_STATUS_SUCCESS;
    case HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_ALLOWED: *(bool *)value = false; return HSA_STATUS_SUCCESS;
    default: return HSA_STATUS_ERROR_INVALID_ARGUMENT;
    }
  }
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

/* Whether the page at `p` is writable (/proc/self/maps): the kernel driver registers locked
 * host memory for writing, so read-only pages (constants, .rodata) cannot be locked. */
static int writable(uintptr_t p) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f)
    return 1;
  char line[512];
  int w = 1;
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    char perms[8];
    if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && p >= lo && p < hi) {
      w = perms[1] == 'w';
      break;
    }
  }
  fclose(f);
  return w;
}

hsa_status_t hsa_amd_memory_lock(void *host, size_t size, hsa_agent_t *agents, int n, void **agent_ptr) {
  (void)agents, (void)n;
  NEED_INIT;
  if (!writable((uintptr_t)host)) {
    say("lock-refused read-only 0x%lx\n", (unsigned long)(uintptr_t)host);
    return HSA_STATUS_ERROR;
  }
  pthread_mutex_lock(&lock);
  struct allocation *hsa = find((uintptr_t)host, size ? size : 1);
  if (hsa && !hsa->locked) {
    /* Memory the runtime allocated cannot be locked (ROCR-Runtime #66). */
    pthread_mutex_unlock(&lock);
    say("lock-of-hsa-memory 0x%lx\n", (unsigned long)(uintptr_t)host);
    return HSA_STATUS_ERROR_INVALID_ARGUMENT;
  }
  struct allocation *a = track((uintptr_t)host, size, POOL_HOST, 1);
  if (a)
    a->gpu_access = 1;
  pthread_mutex_unlock(&lock);
  *agent_ptr = host;
  return a ? HSA_STATUS_SUCCESS : HSA_STATUS_ERROR_OUT_OF_RESOURCES;
}

hsa_status_t hsa_amd_pointer_info(const void *ptr, hsa_amd_pointer_info_t *info, void *(*alloc)(size_t), uint32_t *num_agents, hsa_agent_t **accessible) {
  NEED_INIT;
  if ((num_agents || accessible) && !(num_agents && accessible && alloc))
    return HSA_STATUS_ERROR_INVALID_ARGUMENT;
  if (!info || info->size < sizeof(uint32_t) * 2)
    return HSA_STATUS_ERROR_INVALID_ARGUMENT;
  uint32_t size = info->size < sizeof *info ? info->size : (uint32_t)sizeof *info;
  hsa_amd_pointer_info_t out;
  memset(&out, 0, sizeof out);
  out.size = size;
  pthread_mutex_lock(&lock);
  struct allocation *a = find((uintptr_t)ptr, 1);
  /* The agents that may reach it: the owner's, and the GPU for host memory made accessible. */
  hsa_agent_t reach[2];
  uint32_t reaching = 0;
  if (a) {
    if (a->pool != POOL_DEVICE)
      reach[reaching++].handle = CPU;
    if (a->pool == POOL_DEVICE || a->gpu_access)
      reach[reaching++].handle = GPU;
    out.type = a->locked ? HSA_EXT_POINTER_TYPE_LOCKED : HSA_EXT_POINTER_TYPE_HSA;
    out.agentBaseAddress = (void *)a->base;
    out.hostBaseAddress = (void *)a->base;
    out.sizeInBytes = a->size;
    out.agentOwner.handle = a->pool == POOL_DEVICE ? GPU : CPU;
  } else {
    out.type = HSA_EXT_POINTER_TYPE_UNKNOWN;
  }
  pthread_mutex_unlock(&lock);
  memcpy(info, &out, size);
  if (num_agents) {
    *num_agents = reaching;
    *accessible = alloc(sizeof(hsa_agent_t) * (reaching ? reaching : 1));
    memcpy(*accessible, reach, sizeof(hsa_agent_t) * reaching);
  }
  return HSA_STATUS_SUCCESS;
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

/* ---- signals ------------------------------------------------------------------------------ *
 * Work completes later, on other threads (a queue's packet processor, the DMA engine), as on a
 * GPU: a wait blocks until the value meets the condition or the timeout hint passes (the fake's
 * timestamps are nanoseconds). A signal waited on for a minute in all is a hang: said, and the
 * process stopped. */

static pthread_mutex_t signal_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t signal_changed = PTHREAD_COND_INITIALIZER;

struct signal {
  _Atomic int64_t value;
  struct queue *doorbell_of;
  uint64_t waited_ns;
};

static void signal_add(struct signal *s, int64_t delta) {
  pthread_mutex_lock(&signal_lock);
  atomic_fetch_add(&s->value, delta);
  pthread_cond_broadcast(&signal_changed);
  pthread_mutex_unlock(&signal_lock);
}

hsa_status_t hsa_signal_create(hsa_signal_value_t initial, uint32_t n, const hsa_agent_t *consumers, hsa_signal_t *signal) {
  (void)n, (void)consumers;
  NEED_INIT;
  struct signal *s = calloc(1, sizeof *s);
  atomic_store(&s->value, initial);
  signal->handle = (uint64_t)(uintptr_t)s;
  say("signal-create\n");
  return HSA_STATUS_SUCCESS;
}

hsa_status_t hsa_signal_destroy(hsa_signal_t signal) {
  NEED_INIT;
  if (!signal.handle)
    return HSA_STATUS_ERROR_INVALID_SIGNAL;
  free((void *)(uintptr_t)signal.handle);
  return HSA_STATUS_SUCCESS;
}

static int met(hsa_signal_value_t v, hsa_signal_condition_t cond, hsa_signal_value_t compare) {
  switch (cond) {
  case HSA_SIGNAL_CONDITION_LT: return v < compare;
  case HSA_SIGNAL_CONDITION_EQ: return v == compare;
  case HSA_SIGNAL_CONDITION_NE: return v != compare;
  case HSA_SIGNAL_CONDITION_GTE: return v >= compare;
  default: return 1;
  }
}

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

hsa_signal_value_t hsa_signal_wait_scacquire(hsa_signal_t signal, hsa_signal_condition_t cond, hsa_signal_value_t compare, uint64_t timeout, hsa_wait_state_t state) {
  (void)state;
  struct signal *s = (struct signal *)(uintptr_t)signal.handle;
  uint64_t start = now_ns(), limit = timeout < (uint64_t)60e9 ? timeout : (uint64_t)60e9;
  pthread_mutex_lock(&signal_lock);
  hsa_signal_value_t v;
  while (!met(v = atomic_load(&s->value), cond, compare)) {
    uint64_t waited = now_ns() - start;
    if (waited >= limit)
      break;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    uint64_t step = limit - waited < 10000000 ? limit - waited : 10000000;
    until.tv_nsec += (long)step;
    until.tv_sec += until.tv_nsec / 1000000000;
    until.tv_nsec %= 1000000000;
    pthread_cond_timedwait(&signal_changed, &signal_lock, &until);
  }
  s->waited_ns += now_ns() - start;
  uint64_t total = s->waited_ns;
  pthread_mutex_unlock(&signal_lock);
  if (!met(v, cond, compare) && total >= (uint64_t)60e9) {
    say("hang: waited a minute for a signal at %ld that nothing changes\n", (long)v);
    abort();
  }
  return v;
}

uint64_t hsa_system_get_info_timestamp_frequency(void) { return 1000000000u; }

/* ---- queues ------------------------------------------------------------------------------- */

struct queue {
  hsa_queue_t q; /* first: the plugin reads it */
  _Atomic uint64_t write_index;
  _Atomic uint64_t read_index;
  struct signal doorbell;
  void (*callback)(hsa_status_t, hsa_queue_t *, void *);
  void *data;
  pthread_t thread;
  int stop;
  int inactive; /* an error stopped it */
};

struct code_object {
  unsigned char *bytes;
  size_t size;
};

struct kernel_symbol {
  char name[256];
  uint64_t address; /* variables: their memory, made at lookup */
  uint32_t size;
};

/* System event handlers (hsa_amd_register_system_event_handler). */
static hsa_status_t (*event_handlers[8])(const hsa_amd_event_t *, void *);
static void *event_data[8];
static int event_handler_count;

hsa_status_t hsa_amd_register_system_event_handler(hsa_amd_system_event_callback_t cb, void *data) {
  NEED_INIT;
  pthread_mutex_lock(&lock);
  if (event_handler_count == 8) {
    pthread_mutex_unlock(&lock);
    return HSA_STATUS_ERROR_OUT_OF_RESOURCES;
  }
  event_handlers[event_handler_count] = cb;
  event_data[event_handler_count++] = data;
  pthread_mutex_unlock(&lock);
  return HSA_STATUS_SUCCESS;
}

/* A GPU memory fault at `address`, as ROCr reports one: to every system event handler, and
 * the process aborts unless one of them returns success (ROCr's VMFaultHandler). */
static void memory_fault(uint64_t address) {
  hsa_amd_event_t e;
  memset(&e, 0, sizeof e);
  e.event_type = HSA_AMD_GPU_MEMORY_FAULT_EVENT;
  e.memory_fault.agent.handle = GPU;
  e.memory_fault.virtual_address = address;
  e.memory_fault.fault_reason_mask = HSA_AMD_MEMORY_FAULT_PAGE_NOT_PRESENT;
  int handled = 0;
  for (int i = 0; i < event_handler_count; ++i)
    if (event_handlers[i](&e, event_data[i]) == HSA_STATUS_SUCCESS)
      handled = 1;
  say("memory-fault 0x%lx %s\n", (unsigned long)address, handled ? "handled" : "unhandled");
  if (!handled) {
    fprintf(stderr, "Memory access fault by GPU node-1 (Agent handle: 0x2) on address 0x%lx. Reason: Page not present or supervisor privilege.\n", (unsigned long)address);
    abort();
  }
}

/* FAKE_HSA_FAULT="name:memory" (a memory fault) or "name:queue" (a queue error, as a trap
 * raises): what a dispatch of kernel `name` does. */
static const char *injected_fault(const char *name) {
  const char *v = kernel_setting("FAKE_HSA_FAULT", name);
  return v ? v : "";
}

static void queue_error(struct queue *q, hsa_status_t status) {
  q->inactive = 1;
  say("queue-error %#x\n", (unsigned)status);
  if (q->callback)
    q->callback(status, &q->q, q->data);
}

/* Runs one dispatch: most kernels do nothing here (no GPU); add_k (int n, unsigned k,
 * unsigned *x at kernarg offsets 0, 4, 8) computes as kernels/add_k.c says, so queued work is
 * checked by its results. */
static void run_dispatch(struct queue *q, hsa_kernel_dispatch_packet_t *p, const char *name) {
  const char *fault = injected_fault(name);
  if (!strcmp(fault, "memory")) {
    q->inactive = 1;
    memory_fault(0xdead0000);
    return;
  }
  if (!strcmp(fault, "queue")) {
    queue_error(q, HSA_STATUS_ERROR_EXCEPTION);
    return;
  }
  if (p->group_segment_size > 65536) {
    /* More LDS than a work-group can have: the packet processor refuses it. */
    queue_error(q, HSA_STATUS_ERROR_INVALID_ALLOCATION);
    return;
  }
  if (!strcmp(name, "add_k")) {
    const unsigned char *a = (const unsigned char *)(uintptr_t)p->kernarg_address;
    int n;
    unsigned k;
    uint64_t x;
    memcpy(&n, a, 4);
    memcpy(&k, a + 4, 4);
    memcpy(&x, a + 8, 8);
    uint64_t threads = (uint64_t)p->grid_size_x * p->grid_size_y * p->grid_size_z;
    uint64_t count = n < 0 ? 0 : (uint64_t)n;
    if (count > threads)
      count = threads;
    pthread_mutex_lock(&lock);
    int ok = !count || find((uintptr_t)x, count * 4);
    pthread_mutex_unlock(&lock);
    if (!ok) {
      q->inactive = 1;
      memory_fault(x);
      return;
    }
    for (uint64_t i = 0; i < count; ++i)
      ((unsigned *)(uintptr_t)x)[i] += k;
  }
}

static long delay_us(void) {
  const char *e = getenv("FAKE_HSA_DELAY_US");
  return e ? atol(e) : 20;
}

static void pause_a_little(void) {
  long d = delay_us();
  if (d > 0) {
    struct timespec t = {d / 1000000, (d % 1000000) * 1000};
    nanosleep(&t, 0);
  }
}

/* The packet processor: a thread per queue that runs packets up to the doorbell's value,
 * later than the doorbell was rung, and decrements each completion signal when done. */
static void *processor(void *arg) {
  struct queue *q = arg;
  for (;;) {
    pthread_mutex_lock(&signal_lock);
    while (!q->stop && (int64_t)atomic_load(&q->read_index) > atomic_load(&q->doorbell.value))
      pthread_cond_wait(&signal_changed, &signal_lock);
    int stop = q->stop;
    pthread_mutex_unlock(&signal_lock);
    if (stop)
      return 0;
    uint64_t index = atomic_load(&q->read_index);
    hsa_kernel_dispatch_packet_t *p = (hsa_kernel_dispatch_packet_t *)q->q.base_address + (index % q->q.size);
    uint16_t type = (p->header >> HSA_PACKET_HEADER_TYPE) & 0xff;
    if (type != HSA_PACKET_TYPE_KERNEL_DISPATCH) {
      say("bad-packet header %#x at %lu\n", p->header, (unsigned long)index);
      atomic_store(&q->read_index, index + 1);
      continue;
    }
    pause_a_little();
    struct kernel_symbol *k = (struct kernel_symbol *)(uintptr_t)p->kernel_object;
    pthread_mutex_lock(&lock);
    struct allocation *args = find((uintptr_t)p->kernarg_address, 1);
    int access = args && args->gpu_access;
    size_t size = args ? args->size : 0;
    uint64_t pool = args ? args->pool : 0;
    pthread_mutex_unlock(&lock);
    if (!args || pool != POOL_KERNARG)
      say("bad-packet kernarg 0x%lx is not a kernarg allocation\n", (unsigned long)p->kernarg_address);
    if (!access)
      say("no-access kernarg 0x%lx\n", (unsigned long)p->kernarg_address);
    char line[16384];
    int at = snprintf(line, sizeof line, "dispatch %s dims=%u grid=%u,%u,%u wg=%u,%u,%u group=%u private=%u %s kernarg=",
                      k ? k->name : "?", p->setup & 3, p->grid_size_x, p->grid_size_y, p->grid_size_z,
                      p->workgroup_size_x, p->workgroup_size_y, p->workgroup_size_z, p->group_segment_size,
                      p->private_segment_size, (p->header >> HSA_PACKET_HEADER_BARRIER) & 1 ? "barrier" : "nobarrier");
    for (size_t b = 0; args && b < size && at < (int)sizeof line - 4; ++b)
      at += snprintf(line + at, sizeof line - (size_t)at, "%02x", ((unsigned char *)(uintptr_t)p->kernarg_address)[b]);
    say("%s\n", line);
    if (!q->inactive && k)
      run_dispatch(q, p, k->name);
    if (q->inactive) {
      /* A queue stopped by an error runs nothing more and completes nothing. */
      pthread_mutex_lock(&signal_lock);
      while (!q->stop)
        pthread_cond_wait(&signal_changed, &signal_lock);
      pthread_mutex_unlock(&signal_lock);
      return 0;
    }
    hsa_signal_t done = p->completion_signal;
    p->header = HSA_PACKET_TYPE_INVALID;
    atomic_store(&q->read_index, index + 1);
    if (done.handle)
      signal_add((struct signal *)(uintptr_t)done.handle, -1);
  }
}

hsa_status_t hsa_queue_create(hsa_agent_t agent, uint32_t size, hsa_queue_type32_t type, void (*callback)(hsa_status_t, hsa_queue_t *, void *), void *data, uint32_t private_size, uint32_t group_size, hsa_queue_t **out) {
  (void)type, (void)private_size, (void)group_size;
  NEED_INIT;
  if (agent.handle != GPU || size == 0 || (size & (size - 1)))
    return HSA_STATUS_ERROR_INVALID_ARGUMENT;
  struct queue *q = calloc(1, sizeof *q);
  q->q.base_address = calloc(size, 64);
  for (uint32_t i = 0; i < size; ++i)
    ((hsa_kernel_dispatch_packet_t *)q->q.base_address)[i].header = HSA_PACKET_TYPE_INVALID;
  q->q.size = size;
  q->doorbell.doorbell_of = q;
  atomic_store(&q->doorbell.value, -1);
  q->q.doorbell_signal.handle = (uint64_t)(uintptr_t)&q->doorbell;
  q->callback = callback;
  q->data = data;
  pthread_create(&q->thread, 0, processor, q);
  *out = &q->q;
  say("queue-create %u\n", size);
  return HSA_STATUS_SUCCESS;
}

hsa_status_t hsa_queue_destroy(hsa_queue_t *queue) {
  NEED_INIT;
  struct queue *q = (struct queue *)queue;
  pthread_mutex_lock(&signal_lock);
  q->stop = 1;
  pthread_cond_broadcast(&signal_changed);
  pthread_mutex_unlock(&signal_lock);
  pthread_join(q->thread, 0);
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
  if (s->doorbell_of && (uint64_t)value >= atomic_load(&s->doorbell_of->write_index)) {
    say("bad-packet doorbell %ld beyond the reserved slots\n", (long)value);
    return;
  }
  pthread_mutex_lock(&signal_lock);
  atomic_store(&s->value, value);
  /* A signal set anew (reused for another operation) starts its hang count again. */
  s->waited_ns = 0;
  pthread_cond_broadcast(&signal_changed);
  pthread_mutex_unlock(&signal_lock);
}

void hsa_signal_store_screlease(hsa_signal_t signal, hsa_signal_value_t value) { hsa_signal_store_relaxed(signal, value); }

/* ---- copies ------------------------------------------------------------------------------- */


/* The DMA engine: one thread that runs copies in the order they were asked for, later. */
struct dma {
  struct dma *next;
  void *dst;
  const void *src;
  size_t size;
  struct signal *done;
};
static struct dma *dma_head, *dma_tail;
static pthread_mutex_t dma_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t dma_cv = PTHREAD_COND_INITIALIZER;
static int dma_started;
static pthread_t dma_thread;

/* Copies FAKE_HSA_COPY_HANGS holds: the engine stopped on them, and they run only when the
 * test calls fake_hsa_finish_held_copies. */
static struct dma *held;

/* Runs one copy: its bytes, then its completion signal. */
static void dma_run(struct dma *d) {
  pthread_mutex_lock(&lock);
  int ok = find((uintptr_t)d->dst, d->size) && find((uintptr_t)d->src, d->size);
  pthread_mutex_unlock(&lock);
  if (ok)
    engine_copy(d->dst, d->src, d->size);
  else
    say("use-after-free copy 0x%lx 0x%lx %zu\n", (unsigned long)(uintptr_t)d->dst, (unsigned long)(uintptr_t)d->src, d->size);
  signal_add(d->done, -1);
  free(d);
}

static void *dma_engine(void *arg) {
  (void)arg;
  for (;;) {
    pthread_mutex_lock(&dma_lock);
    while (!dma_head)
      pthread_cond_wait(&dma_cv, &dma_lock);
    struct dma *d = dma_head;
    dma_head = d->next;
    if (!dma_head)
      dma_tail = 0;
    pthread_mutex_unlock(&dma_lock);
    pause_a_little();
    /* FAKE_HSA_COPY_HANGS=N: a copy of N bytes faults the GPU and hangs, as a DMA engine
     * caught in a fault may: its completion signal does not come, and it may still write
     * (fake_hsa_finish_held_copies makes it). */
    const char *hang = getenv("FAKE_HSA_COPY_HANGS");
    if (hang && (size_t)atoll(hang) == d->size) {
      say("copy-hangs 0x%lx 0x%lx %zu\n", (unsigned long)(uintptr_t)d->dst, (unsigned long)(uintptr_t)d->src, d->size);
      pthread_mutex_lock(&dma_lock);
      d->next = held;
      held = d;
      pthread_mutex_unlock(&dma_lock);
      memory_fault(0xdead1000);
      continue;
    }
    dma_run(d);
  }
  return 0;
}

/* For tests: runs the copies FAKE_HSA_COPY_HANGS held, now (a hung engine writing late), and
 * says how many there were. */
int fake_hsa_finish_held_copies(void) {
  pthread_mutex_lock(&dma_lock);
  struct dma *d = held;
  held = 0;
  pthread_mutex_unlock(&dma_lock);
  int n = 0;
  while (d) {
    struct dma *next = d->next;
    say("copy-finishes-late 0x%lx %zu\n", (unsigned long)(uintptr_t)d->dst, d->size);
    dma_run(d);
    d = next;
    ++n;
  }
  return n;
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
  struct dma *d = calloc(1, sizeof *d);
  d->dst = dst;
  d->src = src;
  d->size = size;
  d->done = (struct signal *)(uintptr_t)completion.handle;
  pthread_mutex_lock(&dma_lock);
  if (!dma_started) {
    dma_started = 1;
    pthread_create(&dma_thread, 0, dma_engine, 0);
  }
  if (dma_tail)
    dma_tail->next = d;
  else
    dma_head = d;
  dma_tail = d;
  pthread_cond_signal(&dma_cv);
  pthread_mutex_unlock(&dma_lock);
  say("copy %zu\n", size);
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
  uint64_t at, size;
  if (!strstr(name, ".kd") && elf_variable(e->code->bytes, e->code->size, name, &at, &size) && size > 0 && size < (1 << 20)) {
    /* A global variable: device memory holding its initial bytes, for the executable's life
     * (freed with the process here). */
    void *mem = calloc(1, size);
    memcpy(mem, e->code->bytes + at, size);
    pthread_mutex_lock(&lock);
    track((uintptr_t)mem, size, POOL_DEVICE, 0);
    pthread_mutex_unlock(&lock);
    struct kernel_symbol *k = calloc(1, sizeof *k);
    snprintf(k->name, sizeof k->name, "%s", name);
    k->address = (uint64_t)(uintptr_t)mem;
    k->size = (uint32_t)size;
    say("global %s %lu\n", name, (unsigned long)size);
    symbol->handle = (uint64_t)(uintptr_t)k;
    return HSA_STATUS_SUCCESS;
  }
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
  case HSA_EXECUTABLE_SYMBOL_INFO_VARIABLE_ADDRESS: *(uint64_t *)value = ((struct kernel_symbol *)(uintptr_t)symbol.handle)->address; break;
  case HSA_EXECUTABLE_SYMBOL_INFO_VARIABLE_SIZE: *(uint32_t *)value = ((struct kernel_symbol *)(uintptr_t)symbol.handle)->size; break;
  case HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_SIZE:
  case HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_GROUP_SEGMENT_SIZE:
  case HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_PRIVATE_SEGMENT_SIZE: *(uint32_t *)value = 0; break;
  default: return HSA_STATUS_ERROR_INVALID_ARGUMENT;
  }
  return HSA_STATUS_SUCCESS;
}
