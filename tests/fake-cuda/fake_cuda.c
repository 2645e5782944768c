/* A CUDA driver without a GPU, for testing the cuda plugin up to the driver boundary
 * (tests/tests/cuda_fake_driver.rs builds it into a shared library and points
 * OFFLOAD_CUDA_DRIVER at it).
 *
 * It keeps the driver's contracts that a plugin can get wrong, and says when it does:
 *   - every call but the device queries needs a context current on the calling thread
 *     (CUDA_ERROR_INVALID_CONTEXT otherwise, and a "no-context" line in the log);
 *   - device memory is host memory it tracks: copies must stay inside allocations, frees
 *     must name a live allocation ("bad-copy" / "bad-free" lines otherwise); overlapping
 *     copies give a wrong result, as a copy engine may ("overlapping-copy");
 *   - modules are the bytes given (cubin, PTX or fatbin); PTX containing `bogus_instruction`
 *     is refused with a compiler log; kernels are found by name; PTX and cubin kernels report
 *     their parameter sizes (cuFuncGetParamInfo; from the `.entry` list and the `.nv.info`
 *     records), unless FAKE_CUDA_NO_PARAM_INFO is set (a driver older than 12.4);
 *   - work is asynchronous, as on a GPU: copies and kernels run later on a thread of their
 *     stream, in order (see "streams" below), so a missing wait or memory freed under queued
 *     work shows ("use-after-free", wrong reads);
 *   - contexts are per thread and per device: memory, streams, modules and kernels of one
 *     device used under another's context are refused ("wrong-context");
 *   - launches are written to the log with their shape and the bytes of every parameter, read
 *     through the pointers the plugin passed, with the sizes the kernel has; most kernels do
 *     nothing when they run, saxpy and add_k compute (run_kernel).
 *
 * Environment: FAKE_CUDA_DEVICES (default 1), FAKE_CUDA_CC ("9.0"), FAKE_CUDA_MEMORY (bytes
 * that may be allocated at once), FAKE_CUDA_LOG (file the log lines are appended to),
 * FAKE_CUDA_NO_PARAM_INFO, FAKE_CUDA_KERNEL_LIMITS, FAKE_CUDA_FAULT and
 * FAKE_CUDA_SYNC_GIVES_UP and FAKE_CUDA_COPY_HANGS (below). Launches are
 * refused as the driver refuses them: more threads than the kernel's registers allow (701),
 * more dynamic shared memory than the kernel's attribute (INVALID_VALUE); the attribute can be
 * raised to the device's opt-in limit less the static size. */

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


typedef int CUresult;
enum {
  OK = 0,
  INVALID_VALUE = 1,
  OUT_OF_MEMORY = 2,
  NOT_INITIALIZED = 3,
  INVALID_DEVICE = 101,
  INVALID_IMAGE = 200,
  INVALID_CONTEXT = 201,
  INVALID_PTX = 218,
  INVALID_HANDLE = 400,
  NOT_FOUND = 500,
  ILLEGAL_ADDRESS = 700,
  LAUNCH_OUT_OF_RESOURCES = 701,
  NOT_SUPPORTED = 801,
};

/* Shared memory a block may have with the kernel opted in (an H100/H200's 227 KiB). */
#define SHARED_OPTIN 232448

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialised;
/* A sticky error per context (a kernel faulted): every later call in it returns it. */
static int sticky[16];
static __thread void *current;
static char contexts[16];

/* The device whose primary context is current on this thread (0..15). */
static int context_index(void) { return current ? (int)((char *)current - contexts) : 0; }

#define FAKE_LOG_VARIABLE "FAKE_CUDA_LOG"
#include "../fake-common/fake_common.h"

#define NEED_CONTEXT                                                                             \
  do {                                                                                           \
    if (!initialised)                                                                            \
      return NOT_INITIALIZED;                                                                    \
    if (!current) {                                                                              \
      say("no-context %s\n", __func__);                                                          \
      return INVALID_CONTEXT;                                                                    \
    }                                                                                            \
    if (sticky[context_index()])                                                                 \
      return sticky[context_index()];                                                            \
  } while (0)

static int device_count(void) {
  const char *e = getenv("FAKE_CUDA_DEVICES");
  int n = e ? atoi(e) : 1;
  return n < 0 ? 0 : n > 16 ? 16 : n;
}

/* ---- errors ---------------------------------------------------------------------------- */

static const char *error_name(int e) {
  switch (e) {
  case INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
  case OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
  case NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
  case INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
  case INVALID_IMAGE: return "CUDA_ERROR_INVALID_IMAGE";
  case INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
  case INVALID_PTX: return "CUDA_ERROR_INVALID_PTX";
  case INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
  case NOT_FOUND: return "CUDA_ERROR_NOT_FOUND";
  case ILLEGAL_ADDRESS: return "CUDA_ERROR_ILLEGAL_ADDRESS";
  case LAUNCH_OUT_OF_RESOURCES: return "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES";
  case NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
  default: return 0;
  }
}

CUresult cuGetErrorName(int e, const char **s) {
  *s = error_name(e);
  return *s ? OK : INVALID_VALUE;
}

CUresult cuGetErrorString(int e, const char **s) {
  switch (e) {
  case INVALID_CONTEXT: *s = "invalid device context"; return OK;
  case INVALID_PTX: *s = "a PTX JIT compilation failed"; return OK;
  case OUT_OF_MEMORY: *s = "out of memory"; return OK;
  default: return cuGetErrorName(e, s);
  }
}

/* ---- devices ----------------------------------------------------------------------------- */

CUresult cuInit(unsigned flags) {
  (void)flags;
  initialised = 1;
  return OK;
}

CUresult cuDriverGetVersion(int *v) {
  *v = 12080;
  return OK;
}

CUresult cuDeviceGetCount(int *n) {
  if (!initialised)
    return NOT_INITIALIZED;
  *n = device_count();
  return OK;
}

CUresult cuDeviceGet(int *d, int ordinal) {
  if (ordinal < 0 || ordinal >= device_count())
    return INVALID_DEVICE;
  *d = ordinal;
  return OK;
}

CUresult cuDeviceGetName(char *name, int len, int d) {
  if (d < 0 || d >= device_count())
    return INVALID_DEVICE;
  snprintf(name, (size_t)len, "Fake CUDA device %d", d);
  return OK;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, int d) {
  (void)d;
  *bytes = (size_t)80 << 30;
  return OK;
}

CUresult cuDeviceGetAttribute(int *v, int attribute, int d) {
  if (d < 0 || d >= device_count())
    return INVALID_DEVICE;
  int major = 9, minor = 0;
  const char *cc = getenv("FAKE_CUDA_CC");
  if (cc)
    sscanf(cc, "%d.%d", &major, &minor);
  switch (attribute) {
  case 1: *v = 1024; break;                /* max threads per block */
  case 2: case 3: *v = 1024; break;        /* max block x, y */
  case 4: *v = 64; break;                  /* max block z */
  case 5: *v = 2147483647; break;          /* max grid x */
  case 6: case 7: *v = 65535; break;       /* max grid y, z */
  case 8: *v = 49152; break;               /* shared memory per block */
  case 10: *v = 32; break;                 /* warp size */
  case 16: *v = 132; break;                /* multiprocessors */
  case 97: *v = SHARED_OPTIN; break;      /* shared memory per block, opted in */
  case 75: *v = major; break;
  case 76: *v = minor; break;
  default: *v = 0;
  }
  return OK;
}

CUresult cuDevicePrimaryCtxRetain(void **ctx, int d) {
  if (d < 0 || d >= device_count())
    return INVALID_DEVICE;
  *ctx = &contexts[d];
  return OK;
}

CUresult cuCtxSetCurrent(void *ctx) {
  current = ctx;
  return OK;
}

/* ---- memory ------------------------------------------------------------------------------ */

struct allocation {
  uintptr_t base;
  size_t size;
  int kind; /* 0 device, 1 host, 2 managed */
  int ctx;  /* the device it was made on */
};
static struct allocation allocations[65536];
static size_t live_bytes;

static CUresult allocate(uintptr_t *out, size_t size, int kind) {
  NEED_CONTEXT;
  const char *limit = getenv("FAKE_CUDA_MEMORY");
  pthread_mutex_lock(&lock);
  if (size == 0 || (limit && live_bytes + size > strtoull(limit, 0, 10))) {
    pthread_mutex_unlock(&lock);
    return size == 0 ? INVALID_VALUE : OUT_OF_MEMORY;
  }
  void *p = calloc(1, size);
  int slot = -1;
  for (int i = 0; p && i < 65536; ++i)
    if (!allocations[i].base) {
      slot = i;
      break;
    }
  if (!p || slot < 0) {
    free(p);
    pthread_mutex_unlock(&lock);
    return OUT_OF_MEMORY;
  }
  allocations[slot] = (struct allocation){(uintptr_t)p, size, kind, context_index()};
  live_bytes += size;
  pthread_mutex_unlock(&lock);
  *out = (uintptr_t)p;
  say("alloc %d 0x%lx %zu\n", kind, (unsigned long)*out, size);
  return OK;
}

/* Frees `p` if it is a live allocation of one of `kinds` (a bit mask of kinds). */
static CUresult release(uintptr_t p, int kinds) {
  NEED_CONTEXT;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < 65536; ++i)
    if (allocations[i].base == p && (kinds >> allocations[i].kind & 1)) {
      int kind = allocations[i].kind;
      live_bytes -= allocations[i].size;
      allocations[i].base = 0;
      pthread_mutex_unlock(&lock);
      free((void *)p);
      say("free %d 0x%lx\n", kind, (unsigned long)p);
      return OK;
    }
  pthread_mutex_unlock(&lock);
  say("bad-free %d 0x%lx\n", kinds, (unsigned long)p);
  return INVALID_VALUE;
}

/* The live allocation holding [p, p + n): its kind, or -1 (and its context in *ctx). */
static int find_allocation(uintptr_t p, size_t n, int *ctx) {
  int kind = -1;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < 65536 && kind < 0; ++i)
    if (allocations[i].base && p >= allocations[i].base &&
        p + n <= allocations[i].base + allocations[i].size) {
      kind = allocations[i].kind;
      if (ctx)
        *ctx = allocations[i].ctx;
    }
  pthread_mutex_unlock(&lock);
  return kind;
}

/* Whether [p, p + n) lies inside one live allocation. */
static int inside(uintptr_t p, size_t n) { return find_allocation(p, n, 0) >= 0; }

CUresult cuMemAlloc_v2(uintptr_t *p, size_t n) { return allocate(p, n, 0); }
CUresult cuMemAllocHost_v2(void **p, size_t n) { return allocate((uintptr_t *)p, n, 1); }
CUresult cuMemAllocManaged(uintptr_t *p, size_t n, unsigned flags) {
  (void)flags;
  return allocate(p, n, 2);
}
CUresult cuMemFree_v2(uintptr_t p) { return release(p, 1 << 0 | 1 << 2); }
CUresult cuMemFreeHost(void *p) { return release((uintptr_t)p, 1 << 1); }


/* ---- streams: work runs later, on a thread of its stream, in the stream's order --------- *
 *
 * As on a GPU, a call that enqueues work returns before the work is done: copies and kernels
 * run on the stream's own thread after FAKE_CUDA_DELAY_US (default 20) microseconds each, and
 * cuStreamSynchronize waits for them. A copy from pageable host memory is staged at the call
 * (the source may be reused at once); a copy to pageable memory waits for the stream and
 * completes before the call returns; pinned memory (cuMemAllocHost, managed) is read and
 * written when the work runs. Work whose memory was freed before it ran is reported
 * ("use-after-free") instead of run. The NULL stream of each context is a stream like the
 * others. */

struct op {
  struct op *next;
  int kernel; /* 0 copy, 1 kernel */
  char what[8];
  uintptr_t dst, src;
  size_t n;
  int dst_device, src_device;
  void *staging;
  struct function *f;
  unsigned long threads;
  unsigned char args[256]; /* the first parameters' bytes, for kernels the fake runs */
  int ctx;
  int hangs; /* FAKE_CUDA_COPY_HANGS: held instead of run, until fake_cuda_finish_held_copies */
};

/* The status the next cuStreamSynchronize returns at once (0: none): FAKE_CUDA_SYNC_GIVES_UP,
 * FAKE_CUDA_COPY_HANGS. */
static _Atomic int give_up_next_sync;

/* The copies FAKE_CUDA_COPY_HANGS held, and how many were enqueued (under `lock`). */
static struct op *held_copies;
static int hangs_enqueued, hangs_held;

struct stream {
  pthread_mutex_t m;
  pthread_cond_t cv;
  struct op *head, *tail;
  int stop;
  int started;
  pthread_t thread;
  int ctx;
  int is_default;
};

static struct stream default_streams[16];

static void run_kernel(struct op *o);

static void run_op(struct op *o) {
  if (o->kernel) {
    run_kernel(o);
    return;
  }
  const unsigned char *src = o->staging ? o->staging : (const unsigned char *)o->src;
  /* A side that is an allocation (device memory, or pinned host memory the copy was given)
   * must still be one. */
  if ((o->dst_device && !inside(o->dst, o->n)) || (o->src_device && !o->staging && !inside(o->src, o->n)) ||
      (o->hangs && find_allocation(o->dst, o->n, 0) < 0)) {
    say("use-after-free copy %s 0x%lx 0x%lx %zu\n", o->what, (unsigned long)o->dst,
        (unsigned long)o->src, o->n);
    return;
  }
  engine_copy((unsigned char *)o->dst, src, o->n);
}

static void *stream_worker(void *arg) {
  struct stream *s = arg;
  const char *e = getenv("FAKE_CUDA_DELAY_US");
  long delay = e ? atol(e) : 20;
  pthread_mutex_lock(&s->m);
  for (;;) {
    while (!s->head && !s->stop)
      pthread_cond_wait(&s->cv, &s->m);
    if (!s->head)
      break;
    struct op *o = s->head;
    pthread_mutex_unlock(&s->m);
    if (delay > 0) {
      struct timespec t = {delay / 1000000, (delay % 1000000) * 1000};
      nanosleep(&t, 0);
    }
    if (o->hangs) {
      say("copy-hangs 0x%lx 0x%lx %zu\n", (unsigned long)o->dst, (unsigned long)o->src, o->n);
      struct op *h = malloc(sizeof *h);
      *h = *o;
      o->staging = 0;
      pthread_mutex_lock(&lock);
      h->next = held_copies;
      held_copies = h;
      ++hangs_held;
      pthread_mutex_unlock(&lock);
    } else if (!sticky[o->ctx])
      run_op(o);
    free(o->staging);
    pthread_mutex_lock(&s->m);
    s->head = o->next;
    if (!s->head)
      s->tail = 0;
    free(o);
    pthread_cond_broadcast(&s->cv);
  }
  pthread_mutex_unlock(&s->m);
  return 0;
}

static void stream_init(struct stream *s, int ctx) {
  pthread_mutex_init(&s->m, 0);
  pthread_cond_init(&s->cv, 0);
  s->ctx = ctx;
  s->started = 1;
  pthread_create(&s->thread, 0, stream_worker, s);
}

/* The stream a call names (NULL: the context's default stream), or 0 if it belongs to another
 * context ("wrong-context"). */
static struct stream *stream_of(void *handle, const char *call) {
  int ctx = context_index();
  struct stream *s = handle;
  if (!s) {
    pthread_mutex_lock(&lock);
    s = &default_streams[ctx];
    if (!s->started) {
      s->is_default = 1;
      stream_init(s, ctx);
    }
    pthread_mutex_unlock(&lock);
  }
  if (s->ctx != ctx) {
    say("wrong-context %s stream of device %d under device %d\n", call, s->ctx, ctx);
    return 0;
  }
  return s;
}

static void enqueue(struct stream *s, struct op *o) {
  o->ctx = s->ctx;
  pthread_mutex_lock(&s->m);
  if (s->tail)
    s->tail->next = o;
  else
    s->head = o;
  s->tail = o;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->m);
}

static void drain(struct stream *s) {
  pthread_mutex_lock(&s->m);
  while (s->head)
    pthread_cond_wait(&s->cv, &s->m);
  pthread_mutex_unlock(&s->m);
}

/* A device side of a copy: inside an allocation of the current context. */
static int device_side_ok(const char *what, uintptr_t p, size_t n) {
  int ctx = -1;
  if (find_allocation(p, n, &ctx) < 0)
    return 0;
  if (ctx != context_index()) {
    say("wrong-context copy %s memory of device %d under device %d\n", what, ctx, context_index());
    return 0;
  }
  return 1;
}

static CUresult copy(const char *what, uintptr_t dst, int dst_device, uintptr_t src,
                     int src_device, size_t n, void *stream) {
  NEED_CONTEXT;
  struct stream *s = stream_of(stream, what);
  if (!s)
    return INVALID_CONTEXT;
  if ((dst_device && !device_side_ok(what, dst, n)) || (src_device && !device_side_ok(what, src, n))) {
    say("bad-copy %s 0x%lx 0x%lx %zu\n", what, (unsigned long)dst, (unsigned long)src, n);
    return INVALID_VALUE;
  }
  struct op *o = calloc(1, sizeof *o);
  snprintf(o->what, sizeof o->what, "%s", what);
  o->dst = dst;
  o->src = src;
  o->n = n;
  o->dst_device = dst_device;
  o->src_device = src_device;
  int pageable_src = !src_device && find_allocation(src, n, 0) < 0;
  int pageable_dst = !dst_device && find_allocation(dst, n, 0) < 0;
  if (pageable_src) {
    o->staging = malloc(n ? n : 1);
    memcpy(o->staging, (const void *)src, n);
  }
  /* FAKE_CUDA_COPY_HANGS=N: a copy of N bytes to pinned host memory hangs on the copy engine;
   * the next cuStreamSynchronize gives up (CUDA_ERROR_DEVICE_UNAVAILABLE, 46, which says
   * nothing of the work), and the copy may
   * still write (fake_cuda_finish_held_copies). */
  const char *hang = getenv("FAKE_CUDA_COPY_HANGS");
  if (hang && !dst_device && !pageable_dst && (size_t)strtoull(hang, 0, 10) == n) {
    o->hangs = 1;
    pthread_mutex_lock(&lock);
    ++hangs_enqueued;
    pthread_mutex_unlock(&lock);
    atomic_store(&give_up_next_sync, 46);
  }
  enqueue(s, o);
  if (pageable_dst)
    drain(s);
  say("copy %s %zu\n", what, n);
  return sticky[context_index()];
}

/* For tests: runs the copies FAKE_CUDA_COPY_HANGS held, now (a hung engine writing late), once
 * every such copy enqueued has reached its stream's worker, and says how many there were. */
__attribute__((visibility("default"))) int fake_cuda_finish_held_copies(void) {
  struct timespec start, now;
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (;;) {
    pthread_mutex_lock(&lock);
    int ready = hangs_held >= hangs_enqueued;
    pthread_mutex_unlock(&lock);
    if (ready)
      break;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec - start.tv_sec > 60) {
      say("hang: a held copy never reached its stream\n");
      break;
    }
    struct timespec t = {0, 1000000};
    nanosleep(&t, 0);
  }
  pthread_mutex_lock(&lock);
  struct op *o = held_copies;
  held_copies = 0;
  pthread_mutex_unlock(&lock);
  int count = 0;
  while (o) {
    struct op *next = o->next;
    say("copy-finishes-late 0x%lx %zu\n", (unsigned long)o->dst, o->n);
    run_op(o);
    free(o);
    o = next;
    ++count;
  }
  return count;
}

CUresult cuMemcpyHtoDAsync_v2(uintptr_t dst, const void *src, size_t n, void *stream) {
  return copy("htod", dst, 1, (uintptr_t)src, 0, n, stream);
}
CUresult cuMemcpyDtoHAsync_v2(void *dst, uintptr_t src, size_t n, void *stream) {
  return copy("dtoh", (uintptr_t)dst, 0, src, 1, n, stream);
}
CUresult cuMemcpyDtoDAsync_v2(uintptr_t dst, uintptr_t src, size_t n, void *stream) {
  return copy("dtod", dst, 1, src, 1, n, stream);
}

CUresult cuStreamCreate(void **out, unsigned flags) {
  NEED_CONTEXT;
  struct stream *s = calloc(1, sizeof *s);
  stream_init(s, context_index());
  *out = s;
  say("stream-create %u\n", flags);
  return OK;
}
/* FAKE_CUDA_SYNC_GIVES_UP="name:status": the first cuStreamSynchronize after a launch of
 * kernel `name` returns `status` at once, without waiting, as a synchronize that fails for a
 * reason that says nothing of the work does: the work still runs, later (give_up_next_sync,
 * above). */

static int sync_give_up_status(const char *name) {
  const char *v = kernel_setting("FAKE_CUDA_SYNC_GIVES_UP", name);
  return v ? atoi(v) : 0;
}

CUresult cuStreamSynchronize(void *handle) {
  NEED_CONTEXT;
  struct stream *s = stream_of(handle, "cuStreamSynchronize");
  if (!s)
    return INVALID_CONTEXT;
  int give_up = atomic_exchange(&give_up_next_sync, 0);
  if (give_up) {
    say("stream-synchronize-gives-up %d\n", give_up);
    return give_up;
  }
  say("stream-synchronize %s\n", s->is_default ? "default" : "stream");
  drain(s);
  return sticky[context_index()];
}
CUresult cuStreamDestroy_v2(void *handle) {
  NEED_CONTEXT;
  struct stream *s = stream_of(handle, "cuStreamDestroy");
  if (!s || s->is_default)
    return INVALID_HANDLE;
  /* The driver lets queued work finish; the fake waits for it, then ends the thread. */
  pthread_mutex_lock(&s->m);
  s->stop = 1;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->m);
  pthread_join(s->thread, 0);
  free(s);
  say("stream-destroy\n");
  return OK;
}

/* ---- modules and kernels ----------------------------------------------------------------- */

struct module {
  char *bytes;
  size_t len;
  int ptx;
  int ctx;
  /* Globals looked up so far: device memory holding their initial bytes, freed at unload. */
  int nglobals;
  char global_names[16][256];
  uintptr_t global_ptrs[16];
  size_t global_sizes[16];
};

struct function {
  char name[256];
  int known; /* parameter sizes known (PTX, cubin) */
  int count;
  size_t sizes[256];
  int max_threads;   /* CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK */
  int static_shared; /* CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES */
  int dynamic_limit; /* CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES */
  int ctx;
};

/* FAKE_CUDA_KERNEL_LIMITS="name:threads:static_shared,...": what a kernel's registers and
 * static shared memory allow (default 1024 threads, no static shared memory). */
static void kernel_limits(struct function *f) {
  f->max_threads = 1024;
  f->static_shared = 0;
  const char *e = getenv("FAKE_CUDA_KERNEL_LIMITS");
  size_t n = strlen(f->name);
  for (const char *p = e; p && *p;) {
    if (!strncmp(p, f->name, n) && p[n] == ':') {
      sscanf(p + n + 1, "%d:%d", &f->max_threads, &f->static_shared);
      break;
    }
    p = strchr(p, ',');
    p = p ? p + 1 : 0;
  }
  f->dynamic_limit = 49152 - f->static_shared;
}

/* FAKE_CUDA_FAULT="name:status": launches of kernel `name` fail with `status`; a sticky one
 * (700) is reported by the calls after the launch, as a kernel's fault is, and stays. */
static int injected_fault(const char *name) {
  const char *v = kernel_setting("FAKE_CUDA_FAULT", name);
  return v ? atoi(v) : 0;
}

static size_t image_length(const unsigned char *p, int *ptx) {
  *ptx = 0;
  if (!memcmp(p, "\x7f" "ELF", 4)) {
    uint64_t shoff;
    uint16_t shentsize, shnum;
    memcpy(&shoff, p + 40, 8);
    memcpy(&shentsize, p + 58, 2);
    memcpy(&shnum, p + 60, 2);
    return (size_t)(shoff + (uint64_t)shentsize * shnum);
  }
  if (!memcmp(p, "\x50\xed\x55\xba", 4)) {
    uint64_t size;
    uint16_t header;
    memcpy(&header, p + 6, 2);
    memcpy(&size, p + 8, 8);
    return header + (size_t)size;
  }
  *ptx = 1;
  return strlen((const char *)p);
}

static CUresult load(void **out, const void *image, char *log, size_t log_size) {
  NEED_CONTEXT;
  int ptx;
  size_t len = image_length(image, &ptx);
  if (ptx && !strstr(image, ".version")) {
    say("load-refused\n");
    return INVALID_IMAGE;
  }
  if (ptx && strstr(image, "bogus_instruction")) {
    if (log && log_size)
      snprintf(log, log_size, "ptxas application ptx input, line 9; error   : Unknown "
                              "instruction 'bogus_instruction'\nptxas fatal   : Ptx assembly aborted");
    say("load-refused ptx\n");
    return INVALID_PTX;
  }
  if (!ptx && ((uintptr_t)image & 7)) {
    /* NVIDIA's tools always hand the driver 8-byte aligned binaries; what the driver does with
     * one that is not is undocumented, so the fake refuses it. */
    say("unaligned-image %p\n", image);
    return INVALID_IMAGE;
  }
  struct module *m = calloc(1, sizeof *m);
  m->bytes = malloc(len + 1);
  memcpy(m->bytes, image, len);
  m->bytes[len] = 0;
  m->len = len;
  m->ptx = ptx;
  m->ctx = context_index();
  *out = m;
  say("load %s %zu\n", ptx ? "ptx" : "binary", len);
  return OK;
}

CUresult cuModuleLoadData(void **m, const void *image) { return load(m, image, 0, 0); }

CUresult cuModuleLoadDataEx(void **m, const void *image, unsigned n, int *options, void **values) {
  char *log = 0;
  size_t log_size = 0;
  for (unsigned i = 0; i < n; ++i) {
    if (options[i] == 5)
      log = values[i];
    if (options[i] == 6)
      log_size = (size_t)(uintptr_t)values[i];
  }
  return load(m, image, log, log_size);
}

CUresult cuModuleLoadFatBinary(void **m, const void *image) { return load(m, image, 0, 0); }

CUresult cuModuleUnload(void *m) {
  NEED_CONTEXT;
  struct module *mod = m;
  for (int i = 0; i < mod->nglobals; ++i)
    release(mod->global_ptrs[i], 1 << 0);
  free(mod->bytes);
  free(mod);
  say("unload\n");
  return OK;
}

/* Reads the parameter list of `.entry name(` in PTX text. */
static void ptx_params(const char *text, struct function *f) {
  char key[300];
  snprintf(key, sizeof key, ".entry %s(", f->name);
  const char *p = strstr(text, key);
  if (!p)
    return;
  p += strlen(key);
  const char *end = strchr(p, ')');
  if (!end)
    return;
  f->known = 1;
  while ((p = strstr(p, ".param")) && p < end && f->count < 256) {
    p += 6;
    while (*p == ' ' || *p == '\t')
      ++p;
    /* .u32 .s64 .f32 .b64 ...: the digits are the bits */
    int bits = atoi(p + 2);
    if (*p != '.' || bits % 8 || bits == 0) {
      f->known = 0;
      return;
    }
    f->sizes[f->count++] = (size_t)bits / 8;
  }
}

/* Reads the EIATTR_KPARAM_INFO records of a cubin's `.nv.info.<name>` section, as the driver
 * knows a cubin kernel's parameters: (u8 format 4, u8 attribute 0x17, u16 12) then u32 index,
 * u16 ordinal, u16 offset, u32 flags with the size in bits 18-31. */
static void cubin_params(const unsigned char *elf, size_t len, struct function *f) {
  struct elf e;
  struct elf_section info;
  char want[300];
  snprintf(want, sizeof want, ".nv.info.%s", f->name);
  if (!elf_open(&e, elf, len) || !elf_section_by_name(&e, want, &info))
    return;
  const unsigned char *d = elf + info.off;
  uint64_t size = info.size;
  int bank = 0; /* a parameter bank (EIATTR_PARAM_CBANK / CBANK_PARAM_SIZE > 0) */
  for (uint64_t at = 0; at + 4 <= size;) {
    unsigned format = d[at], attribute = d[at + 1];
    uint16_t value;
    memcpy(&value, d + at + 2, 2);
    at += 4;
    if (format == 3 && attribute == 0x19 && value > 0)
      bank = 1;
    if (format != 4)
      continue;
    if (attribute == 0x0a)
      bank = 1;
    if (attribute == 0x17 && value == 12 && at + 12 <= size) {
      uint16_t ordinal;
      uint32_t flags;
      memcpy(&ordinal, d + at + 4, 2);
      memcpy(&flags, d + at + 8, 4);
      if (ordinal < 256) {
        f->sizes[ordinal] = flags >> 18;
        if (ordinal + 1 > f->count)
          f->count = ordinal + 1;
        f->known = 1;
      }
    }
    at += value;
  }
  /* A kernel without parameters has neither records nor a parameter bank. */
  if (!f->known && !bank)
    f->known = 1;
}

CUresult cuModuleGetFunction(void **out, void *m, const char *name) {
  NEED_CONTEXT;
  struct module *mod = m;
  size_t n = strlen(name);
  int found = 0;
  for (size_t i = 0; !found && i + n <= mod->len; ++i)
    found = !memcmp(mod->bytes + i, name, n) && (i + n == mod->len || !mod->bytes[i + n] ||
                                                 mod->bytes[i + n] == '(');
  if (!found || n >= 256)
    return NOT_FOUND;
  if (mod->ctx != context_index()) {
    say("wrong-context cuModuleGetFunction module of device %d under device %d\n", mod->ctx,
        context_index());
    return INVALID_CONTEXT;
  }
  struct function *f = calloc(1, sizeof *f);
  memcpy(f->name, name, n + 1);
  f->ctx = mod->ctx;
  kernel_limits(f);
  if (mod->ptx)
    ptx_params(mod->bytes, f);
  else if (!memcmp(mod->bytes, "\x7f" "ELF", 4))
    cubin_params((const unsigned char *)mod->bytes, mod->len, f);
  *out = f;
  return OK;
}

/* Globals, as the driver has them, in device memory of their own: a cubin's data symbols
 * with their bytes from the image; PTX's `.global`/`.const` `.b8 name[N]` with an optional
 * `= {b, b, ...}` initialiser (the rest zeros). Other PTX element types: not found. */
CUresult cuModuleGetGlobal_v2(uintptr_t *p, size_t *n, void *m, const char *name) {
  NEED_CONTEXT;
  struct module *mod = m;
  for (int i = 0; i < mod->nglobals; ++i)
    if (!strcmp(mod->global_names[i], name)) {
      if (p)
        *p = mod->global_ptrs[i];
      if (n)
        *n = mod->global_sizes[i];
      return OK;
    }
  if (strlen(name) >= 256 || mod->nglobals >= 16)
    return NOT_FOUND;
  uint64_t from, bytes;
  if (!mod->ptx && elf_variable((const unsigned char *)mod->bytes, mod->len, name, &from, &bytes)) {
    /* A cubin's variable: device memory holding its bytes from the image. */
    if (bytes == 0 || bytes > (1 << 20))
      return NOT_FOUND;
    uintptr_t dev;
    CUresult r = allocate(&dev, bytes, 0);
    if (r != OK)
      return r;
    memcpy((void *)dev, mod->bytes + from, bytes);
    int g = mod->nglobals++;
    snprintf(mod->global_names[g], 256, "%s", name);
    mod->global_ptrs[g] = dev;
    mod->global_sizes[g] = bytes;
    say("global %s %lu\n", name, (unsigned long)bytes);
    if (p)
      *p = dev;
    if (n)
      *n = bytes;
    return OK;
  }
  if (!mod->ptx)
    return NOT_FOUND;
  char key[300];
  snprintf(key, sizeof key, ".b8 %s[", name);
  const char *at = strstr(mod->bytes, key);
  if (!at)
    return NOT_FOUND;
  const char *line = at;
  while (line > mod->bytes && line[-1] != '\n')
    --line;
  char decl[256];
  snprintf(decl, sizeof decl, "%.*s", (int)(at - line < 255 ? at - line : 255), line);
  if (!strstr(decl, ".global") && !strstr(decl, ".const"))
    return NOT_FOUND;
  size_t size = strtoull(at + strlen(key), 0, 10);
  if (size == 0 || size > (1 << 20))
    return NOT_FOUND;
  uintptr_t dev;
  CUresult r = allocate(&dev, size, 0);
  if (r != OK)
    return r;
  const char *init = strchr(at, '{');
  const char *end = strchr(at, ';');
  if (init && end && init < end) {
    unsigned char *bytes = (unsigned char *)dev;
    const char *q = init + 1;
    for (size_t i = 0; i < size && q < end; ++i) {
      char *next;
      unsigned long v = strtoul(q, &next, 10);
      if (next == q)
        break;
      bytes[i] = (unsigned char)v;
      q = next;
      while (q < end && (*q == ',' || *q == ' '))
        ++q;
    }
  }
  int g = mod->nglobals++;
  snprintf(mod->global_names[g], 256, "%s", name);
  mod->global_ptrs[g] = dev;
  mod->global_sizes[g] = size;
  say("global %s %zu\n", name, size);
  if (p)
    *p = dev;
  if (n)
    *n = size;
  return OK;
}

CUresult cuFuncGetParamInfo(void *fn, size_t index, size_t *offset, size_t *size) {
  NEED_CONTEXT;
  struct function *f = fn;
  /* FAKE_CUDA_NO_PARAM_INFO: a driver older than 12.4, which cannot say. */
  if (!f->known || getenv("FAKE_CUDA_NO_PARAM_INFO"))
    return NOT_SUPPORTED;
  if (index >= (size_t)f->count)
    return INVALID_VALUE;
  size_t at = 0;
  for (size_t i = 0; i <= index; ++i) {
    at = (at + f->sizes[i] - 1) / f->sizes[i] * f->sizes[i];
    if (i < index)
      at += f->sizes[i];
  }
  *offset = at;
  *size = f->sizes[index];
  return OK;
}

CUresult cuFuncGetAttribute(int *v, int attribute, void *fn) {
  NEED_CONTEXT;
  struct function *f = fn;
  switch (attribute) {
  case 0: *v = f->max_threads; break;
  case 1: *v = f->static_shared; break;
  case 8: *v = f->dynamic_limit; break;
  default: *v = 0;
  }
  return OK;
}

CUresult cuFuncSetAttribute(void *fn, int attribute, int value) {
  NEED_CONTEXT;
  struct function *f = fn;
  say("attribute %s %d %d\n", f->name, attribute, value);
  if (attribute == 8) {
    if (value < 0 || value + f->static_shared > SHARED_OPTIN)
      return INVALID_VALUE;
    f->dynamic_limit = value;
  }
  return OK;
}

/* Kernels whose name has `rendezvous` in it wait (up to 10 s) until FAKE_CUDA_RENDEZVOUS (default 2)
 * launches of them are running at once, as kernels that wait for each other through memory
 * do on a GPU; "rendezvous-timeout" in the log when they did not all come. */
static pthread_cond_t arrived = PTHREAD_COND_INITIALIZER;
static int rendezvous_count;

static void rendezvous(void) {
  const char *e = getenv("FAKE_CUDA_RENDEZVOUS");
  int want = e ? atoi(e) : 2;
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 10;
  pthread_mutex_lock(&lock);
  ++rendezvous_count;
  pthread_cond_broadcast(&arrived);
  int timed_out = 0;
  while (rendezvous_count < want && !timed_out)
    timed_out = pthread_cond_timedwait(&arrived, &lock, &until) != 0;
  pthread_mutex_unlock(&lock);
  if (timed_out)
    say("rendezvous-timeout\n");
}

CUresult cuLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shared, void *stream, void **params,
                        void **extra) {
  NEED_CONTEXT;
  struct function *f = fn;
  if (extra)
    return INVALID_VALUE;
  if ((unsigned long)bx * by * bz > (unsigned long)f->max_threads) {
    say("launch-refused %s out-of-resources\n", f->name);
    return LAUNCH_OUT_OF_RESOURCES;
  }
  if ((int)shared > f->dynamic_limit) {
    say("launch-refused %s shared=%u limit=%d\n", f->name, shared, f->dynamic_limit);
    return INVALID_VALUE;
  }
  int fault = injected_fault(f->name);
  if (fault && fault != ILLEGAL_ADDRESS) {
    say("launch-refused %s status=%d\n", f->name, fault);
    return fault;
  }
  if (f->ctx != context_index()) {
    say("wrong-context cuLaunchKernel kernel of device %d under device %d\n", f->ctx, context_index());
    return INVALID_CONTEXT;
  }
  struct stream *s = stream_of(stream, "cuLaunchKernel");
  if (!s)
    return INVALID_CONTEXT;
  char line[8192];
  int at = snprintf(line, sizeof line, "launch %s grid=%u,%u,%u block=%u,%u,%u shared=%u %s params=",
                    f->name, gx, gy, gz, bx, by, bz, shared, stream ? "stream" : "default");
  int count = f->known ? f->count : 0;
  struct op *o = calloc(1, sizeof *o);
  size_t packed = 0;
  for (int i = 0; i < count && at < (int)sizeof line - 40; ++i) {
    const unsigned char *v = params[i];
    if (i)
      line[at++] = ',';
    for (size_t b = 0; b < f->sizes[i] && at < (int)sizeof line - 40; ++b)
      at += snprintf(line + at, sizeof line - (size_t)at, "%02x", v[b]);
    /* The values, as the driver copies them at the call, packed at their natural alignment. */
    packed = (packed + f->sizes[i] - 1) / f->sizes[i] * f->sizes[i];
    if (packed + f->sizes[i] <= sizeof o->args)
      memcpy(o->args + packed, v, f->sizes[i]);
    packed += f->sizes[i];
  }
  say("%s\n", line);
  o->kernel = 1;
  o->f = f;
  o->threads = (unsigned long)gx * gy * gz * bx * by * bz;
  enqueue(s, o);
  int give_up = sync_give_up_status(f->name);
  if (give_up)
    atomic_store(&give_up_next_sync, give_up);
  return OK;
}

/* Kernels run on their stream's thread. Most do nothing here (the fake has no GPU); saxpy
 * (int n, float a, const float *x, float *y) and add_k (int n, unsigned k, unsigned *x) run as
 * their C sources in kernels/ say, so queued work can be checked by its results; one that touches memory outside an allocation is a fault (700), as
 * is FAKE_CUDA_FAULT=name:700; rendezvous kernels wait for each other. */
static void run_kernel(struct op *o) {
  struct function *f = o->f;
  if (strstr(f->name, "rendezvous"))
    rendezvous();
  if (injected_fault(f->name) == ILLEGAL_ADDRESS) {
    say("fault %s %d\n", f->name, ILLEGAL_ADDRESS);
    sticky[o->ctx] = ILLEGAL_ADDRESS;
    return;
  }
  if (!strcmp(f->name, "add_k") && f->known && f->count == 3) {
    int n;
    unsigned k;
    uint64_t x;
    memcpy(&n, o->args, 4);
    memcpy(&k, o->args + 4, 4);
    memcpy(&x, o->args + 8, 8);
    unsigned long count = n < 0 ? 0 : (unsigned long)n;
    if (count > o->threads)
      count = o->threads;
    if (count && !inside(x, count * 4)) {
      say("fault add_k outside memory\n");
      sticky[o->ctx] = ILLEGAL_ADDRESS;
      return;
    }
    for (unsigned long i = 0; i < count; ++i)
      ((unsigned *)x)[i] += k;
  }
  if (!strcmp(f->name, "saxpy") && f->known && f->count == 4) {
    int n;
    float a;
    uint64_t x, y;
    memcpy(&n, o->args, 4);
    memcpy(&a, o->args + 4, 4);
    memcpy(&x, o->args + 8, 8);
    memcpy(&y, o->args + 16, 8);
    unsigned long count = n < 0 ? 0 : (unsigned long)n;
    if (count > o->threads)
      count = o->threads;
    if (count && (!inside(x, count * 4) || !inside(y, count * 4))) {
      say("fault saxpy outside memory\n");
      sticky[o->ctx] = ILLEGAL_ADDRESS;
      return;
    }
    for (unsigned long i = 0; i < count; ++i)
      ((float *)y)[i] = a * ((const float *)x)[i] + ((float *)y)[i];
  }
}
