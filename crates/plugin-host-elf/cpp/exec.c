/* How the host plugin runs the work items of a block (C: what happens here jumps between stacks
 * and out of signal handlers, which must not cross Rust frames).
 *
 * Calls. A native kernel is called once per work item through a direct call with its arguments
 * already placed where the C calling convention wants them (integer and floating-point
 * registers, then the stack), prepared once per launch: no libffi per item. A kernel the JIT
 * turned into a work-group function is called once per block with the packed arguments.
 *
 * Barriers. In a shared object, a kernel that calls offload_barrier() runs its work items as
 * fibers (a small stack each, a register switch of a few nanoseconds): each runs to its barrier,
 * then the next; when all have reached it, all go on. Whether a block needs fibers is found as
 * it runs: work item 0 runs directly on the worker's stack; if it returns without reaching a
 * barrier, the others are called directly after it, and no fiber is made; if it reaches one,
 * the others become fibers that it brings along at each of its barriers. (Bitcode kernels with
 * barriers mostly need none of this: the JIT cuts them into regions between barriers, run as
 * loops in the work-group function.)
 *
 * Faults. A kernel that raises SIGSEGV, SIGBUS, SIGFPE or SIGILL while a worker runs a block
 * jumps back to the block's start, and the launch fails with the signal, the address and the
 * work item, as a GPU context does after a fault. A signal anywhere else goes to the handler
 * that was there before (Rust's stack-overflow report, or the default). */

#define _GNU_SOURCE
#include <ffi.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

/* ---- the kernel header's context ----------------------------------------------------------- */

/* The header's own definition (include/offload_kernel.h), not a copy. */
#define OFFLOAD_HOST_CONTEXT_ONLY
#include "offload_kernel.h"
#include <stddef.h>
typedef offload_host_context context_t;

/* Its size and field offsets, for the test that pins the Rust mirror (HostContext) to it. */
void offload_context_layout(size_t out[8]) {
  out[0] = sizeof(context_t);
  out[1] = offsetof(context_t, thread_id);
  out[2] = offsetof(context_t, block_id);
  out[3] = offsetof(context_t, block_dim);
  out[4] = offsetof(context_t, grid_dim);
  out[5] = offsetof(context_t, shared);
  out[6] = offsetof(context_t, shared_bytes);
  out[7] = offsetof(context_t, reserved);
}

/* The worker's context. Initial-exec TLS (a few bytes of the static TLS surplus glibc keeps for
 * libraries loaded later): reading it is one instruction, and images read it on every ID. */
static __thread context_t worker_context __attribute__((tls_model("initial-exec")));

/* What the image's __offload_host_context points to. */
const context_t *offload_current_context(void) { return &worker_context; }

/* The same, writable, for the plugin. */
context_t *offload_worker_context(void) { return &worker_context; }

/* ---- fault guard ---------------------------------------------------------------------------- */

static __thread sigjmp_buf *guard;
static __thread int fault_signal;
static __thread void *fault_address;

static const int SIGNALS[4] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};
static struct sigaction previous[4];

static void handler(int sig, siginfo_t *info, void *context) {
  if (guard) {
    sigjmp_buf *to = guard;
    guard = 0;
    fault_signal = sig;
    fault_address = info ? info->si_addr : 0;
    siglongjmp(*to, 1);
  }
  for (int i = 0; i < 4; ++i) {
    if (SIGNALS[i] != sig)
      continue;
    struct sigaction *p = &previous[i];
    if ((p->sa_flags & SA_SIGINFO) && p->sa_sigaction) {
      p->sa_sigaction(sig, info, context);
      return;
    }
    if (!(p->sa_flags & SA_SIGINFO) && p->sa_handler == SIG_IGN)
      return;
    if (!(p->sa_flags & SA_SIGINFO) && p->sa_handler != SIG_DFL) {
      p->sa_handler(sig);
      return;
    }
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

int offload_guard_install(void) {
  static int done;
  if (__atomic_exchange_n(&done, 1, __ATOMIC_SEQ_CST))
    return 0;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = handler;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < 4; ++i)
    if (sigaction(SIGNALS[i], &sa, &previous[i]) != 0)
      return -1;
  return 0;
}

/* ---- calls ---------------------------------------------------------------------------------- */

#if defined(__x86_64__)
#define INT_REGS 6
#elif defined(__aarch64__)
#define INT_REGS 8
#else
#define INT_REGS 0
#endif
#define FLOAT_REGS 8
#define STACK_SLOTS 16

/* A kernel call prepared once per launch (filled in by the plugin's Rust side). */
struct call {
  void (*fn)(void);
  uint64_t ints[8];
  uint64_t floats[FLOAT_REGS];
  uint64_t stack[STACK_SLOTS];
  int nstack; /* stack slots used; -1: call through libffi */
  ffi_cif *cif;
  void **argv;
};

static double as_double(uint64_t bits) {
  double d;
  memcpy(&d, &bits, sizeof d);
  return d;
}

/* One work item. */
static void call_item(const struct call *c) {
#if INT_REGS > 0
  if (c->nstack >= 0) {
    const uint64_t *i = c->ints;
    const uint64_t *f = c->floats;
#define F(k) as_double(f[k])
#if INT_REGS == 6
    if (c->nstack == 0) {
      ((void (*)(uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, double, double, double,
                 double, double, double, double, double))c->fn)(i[0], i[1], i[2], i[3], i[4], i[5],
                                                                F(0), F(1), F(2), F(3), F(4), F(5),
                                                                F(6), F(7));
      return;
    }
    const uint64_t *s = c->stack;
    ((void (*)(uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, double, double, double,
               double, double, double, double, double, uint64_t, uint64_t, uint64_t, uint64_t,
               uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
               uint64_t, uint64_t, uint64_t, uint64_t))c->fn)(
        i[0], i[1], i[2], i[3], i[4], i[5], F(0), F(1), F(2), F(3), F(4), F(5), F(6), F(7), s[0],
        s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9], s[10], s[11], s[12], s[13], s[14],
        s[15]);
    return;
#else
    if (c->nstack == 0) {
      ((void (*)(uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                 double, double, double, double, double, double, double, double))c->fn)(
          i[0], i[1], i[2], i[3], i[4], i[5], i[6], i[7], F(0), F(1), F(2), F(3), F(4), F(5), F(6),
          F(7));
      return;
    }
    const uint64_t *s = c->stack;
    ((void (*)(uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
               double, double, double, double, double, double, double, double, uint64_t, uint64_t,
               uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
               uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t))c->fn)(
        i[0], i[1], i[2], i[3], i[4], i[5], i[6], i[7], F(0), F(1), F(2), F(3), F(4), F(5), F(6),
        F(7), s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9], s[10], s[11], s[12],
        s[13], s[14], s[15]);
    return;
#endif
#undef F
  }
#endif
  ffi_call(c->cif, c->fn, 0, c->argv);
}

/* Where the register calls are available (the plugin prepares them only then). */
int offload_int_registers(void) { return INT_REGS; }

/* ---- fibers --------------------------------------------------------------------------------- */

#define FIBER_STACK (256 * 1024)

struct fiber {
  void *stack; /* mapping, guard page first */
  void *sp;    /* saved stack pointer (x86-64 switch) */
  ucontext_t uc;
  unsigned id[3];
  int state; /* 0 runnable, 1 at a barrier, 2 done */
};

/* Per worker thread. */
static __thread struct fiber *fibers;
static __thread unsigned nfibers;
static __thread struct fiber *current;
static __thread void *scheduler_sp;
#if !(defined(__x86_64__) && !defined(OFFLOAD_FIBERS_UCONTEXT))
static __thread ucontext_t scheduler_uc;
#endif
static __thread const struct call *running;
static __thread int barrier_outside_fiber;

/* The x86-64 switch: callee-saved registers and the FP control words on the old stack, then the
 * new stack. A new fiber's stack holds a frame that "returns" into fiber_start. */
#if defined(__x86_64__) && !defined(OFFLOAD_FIBERS_UCONTEXT)
void offload_fiber_switch(void **save_sp, void *new_sp);
__asm__(".text\n"
        ".globl offload_fiber_switch\n"
        ".hidden offload_fiber_switch\n"
        ".type offload_fiber_switch,@function\n"
        "offload_fiber_switch:\n"
        "  pushq %rbp\n"
        "  pushq %rbx\n"
        "  pushq %r12\n"
        "  pushq %r13\n"
        "  pushq %r14\n"
        "  pushq %r15\n"
        "  subq $8, %rsp\n"
        "  stmxcsr (%rsp)\n"
        "  fnstcw 4(%rsp)\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  ldmxcsr (%rsp)\n"
        "  fldcw 4(%rsp)\n"
        "  addq $8, %rsp\n"
        "  popq %r15\n"
        "  popq %r14\n"
        "  popq %r13\n"
        "  popq %r12\n"
        "  popq %rbx\n"
        "  popq %rbp\n"
        "  ret\n"
        ".size offload_fiber_switch, .-offload_fiber_switch\n"
        ".globl offload_fiber_entry\n"
        ".hidden offload_fiber_entry\n"
        ".type offload_fiber_entry,@function\n"
        "offload_fiber_entry:\n"
        "  movq %rbx, %rdi\n"
        "  callq *%r12\n"
        "  ud2\n"
        ".size offload_fiber_entry, .-offload_fiber_entry\n");
void offload_fiber_entry(void);
#define ASM_FIBERS 1
#else
#define ASM_FIBERS 0
#endif

static void fiber_main(struct fiber *f);

#if !ASM_FIBERS
static void fiber_main_uc(void) { fiber_main(current); }
#endif

/* Switches from the scheduler to `f`. */
static void resume(struct fiber *f) {
  current = f;
#if ASM_FIBERS
  offload_fiber_switch(&scheduler_sp, f->sp);
#else
  swapcontext(&scheduler_uc, &f->uc);
#endif
  current = 0;
}

/* Switches from the current fiber back to the scheduler. */
static void suspend(void) {
  struct fiber *f = current;
#if ASM_FIBERS
  offload_fiber_switch(&f->sp, scheduler_sp);
#else
  swapcontext(&f->uc, &scheduler_uc);
#endif
}

static void fiber_main(struct fiber *f) {
  call_item(running);
  f->state = 2;
  suspend();
  abort(); /* never resumed after it is done */
}

/* A fiber ready to run the current call from its start. */
static int fiber_prepare(struct fiber *f) {
  if (!f->stack) {
    void *m = mmap(0, FIBER_STACK, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (m == MAP_FAILED)
      return -1;
    mprotect(m, (size_t)sysconf(_SC_PAGESIZE), PROT_NONE); /* guard page */
    f->stack = m;
  }
  f->state = 0;
#if ASM_FIBERS
  uint64_t *top = (uint64_t *)((char *)f->stack + FIBER_STACK);
  top -= 2;          /* alignment: offload_fiber_entry starts with rsp % 16 == 8 after its ret */
  *--top = (uint64_t)(uintptr_t)offload_fiber_entry; /* ret address */
  *--top = 0;                                         /* rbp */
  *--top = (uint64_t)(uintptr_t)f;                    /* rbx: the fiber */
  *--top = (uint64_t)(uintptr_t)fiber_main;           /* r12: what to call */
  *--top = 0;                                         /* r13 */
  *--top = 0;                                         /* r14 */
  *--top = 0;                                         /* r15 */
  uint32_t mxcsr;
  uint16_t fpcw;
  __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
  __asm__ volatile("fnstcw %0" : "=m"(fpcw));
  uint64_t words = (uint64_t)mxcsr | (uint64_t)fpcw << 32;
  *--top = words;
  f->sp = top;
#else
  getcontext(&f->uc);
  f->uc.uc_stack.ss_sp = f->stack;
  f->uc.uc_stack.ss_size = FIBER_STACK;
  f->uc.uc_link = 0;
  makecontext(&f->uc, fiber_main_uc, 0);
#endif
  return 0;
}

static int ensure_fibers(unsigned n) {
  if (n <= nfibers)
    return 0;
  struct fiber *grown = realloc(fibers, n * sizeof *grown);
  if (!grown)
    return -1;
  memset(grown + nfibers, 0, (n - nfibers) * sizeof *grown);
  fibers = grown;
  nfibers = n;
  return 0;
}

/* ---- blocks --------------------------------------------------------------------------------- */

struct fault {
  int signal;
  void *address;
  unsigned item[3];
};

enum { OK = 0, FAULT = 1, DIVERGENT = 2, NO_MEMORY = 3 };

/* The block this worker runs. Work item 0 runs directly on the worker's stack; the others
 * become fibers only if item 0 reaches a barrier. */
static __thread struct {
  context_t *ctx;
  unsigned bx, by, bz, n;
  int item0;          /* item 0 is running (directly) */
  int fibers_started; /* items 1..n-1 are fibers */
  int error;          /* why the block was left through the guard (not a signal) */
} block;

static void set_id(context_t *ctx, unsigned x, unsigned y, unsigned z) {
  if (ctx) {
    ctx->thread_id[0] = x;
    ctx->thread_id[1] = y;
    ctx->thread_id[2] = z;
  }
}

/* Leaves the block with `error` (from inside a kernel: its frames are abandoned). */
static void leave_block(int error) {
  sigjmp_buf *to = guard;
  guard = 0;
  block.error = error;
  siglongjmp(*to, 2);
}

/* Runs fibers 1..n-1 each until its next barrier. `finish`: item 0 has returned, so each must
 * return too. */
static void run_others(int finish) {
  for (unsigned k = 1; k < block.n; ++k) {
    struct fiber *f = &fibers[k];
    if (f->state == 2)
      leave_block(DIVERGENT); /* returned while item 0 waits at a barrier */
    f->state = 0;
    set_id(block.ctx, f->id[0], f->id[1], f->id[2]);
    resume(f);
    if (f->state == 1 && finish)
      leave_block(DIVERGENT); /* at a barrier item 0 never reached */
    if (f->state == 2 && !finish)
      leave_block(DIVERGENT);
  }
  set_id(block.ctx, 0, 0, 0);
}

/* What the image's offload_barrier() calls (through __offload_host_barrier). */
void offload_barrier_impl(void) {
  if (current) {
    /* A fiber (work item 1..n-1): wait for item 0's next barrier. */
    current->state = 1;
    suspend();
    return;
  }
  if (!block.item0 || !guard) {
    /* Items 1..n-1 run directly because item 0 reached no barrier (or no block runs here):
     * work items that reach different barriers are an error. */
    barrier_outside_fiber = 1;
    return;
  }
  /* Item 0 is at a barrier: bring every other item to it, then go on. */
  if (!block.fibers_started) {
    if (ensure_fibers(block.n))
      leave_block(NO_MEMORY);
    unsigned k = 0;
    for (unsigned z = 0; z < block.bz; ++z)
      for (unsigned y = 0; y < block.by; ++y)
        for (unsigned x = 0; x < block.bx; ++x, ++k) {
          if (k == 0)
            continue;
          if (fiber_prepare(&fibers[k]))
            leave_block(NO_MEMORY);
          fibers[k].id[0] = x;
          fibers[k].id[1] = y;
          fibers[k].id[2] = z;
        }
    block.fibers_started = 1;
  }
  run_others(0);
}

/* Runs the work items of one block: item 0 directly; if it reaches no barrier, the others
 * directly after it (no fiber is ever made); if it does, the others as fibers that it brings
 * along at each of its barriers (offload_barrier_impl). Returns OK, FAULT (with `out`),
 * DIVERGENT (some work items reached a barrier others did not), NO_MEMORY. */
int offload_run_block(const struct call *call, context_t *ctx, unsigned bx, unsigned by,
                      unsigned bz, struct fault *out) {
  sigjmp_buf here;
  volatile unsigned x = 0, y = 0, z = 0;
  running = call;
  barrier_outside_fiber = 0;
  block.ctx = ctx;
  block.bx = bx;
  block.by = by;
  block.bz = bz;
  block.n = bx * by * bz;
  block.item0 = 0;
  block.fibers_started = 0;
  block.error = OK;
  int why = sigsetjmp(here, 0);
  if (why) {
    /* SA_NODEFER: nothing is blocked. Fibers in flight are abandoned; their stacks are reused
     * from the start. */
    current = 0;
    block.item0 = 0;
    if (why == 2)
      return block.error;
    out->signal = fault_signal;
    out->address = fault_address;
    if (ctx) {
      out->item[0] = ctx->thread_id[0];
      out->item[1] = ctx->thread_id[1];
      out->item[2] = ctx->thread_id[2];
    } else {
      out->item[0] = x;
      out->item[1] = y;
      out->item[2] = z;
    }
    return FAULT;
  }
  guard = &here;
  set_id(ctx, 0, 0, 0);
  block.item0 = 1;
  call_item(call);
  block.item0 = 0;
  if (block.fibers_started) {
    run_others(1);
    guard = 0;
    return OK;
  }
  for (z = 0; z < bz; ++z)
    for (y = 0; y < by; ++y)
      for (x = z == 0 && y == 0 ? 1 : 0; x < bx; ++x) {
        set_id(ctx, x, y, z);
        call_item(call);
      }
  guard = 0;
  return barrier_outside_fiber ? DIVERGENT : OK;
}

/* Runs a work-group function (the JIT's) for the blocks begin..end. Returns OK, FAULT (with
 * `out`) or DIVERGENT (with the linear index of the block in `diverged`). */
int offload_run_blocks_wg(uint64_t (*wg)(const uint64_t *, context_t *, uint64_t, uint64_t,
                                         void *),
                          const uint64_t *args, context_t *ctx, uint64_t begin, uint64_t end,
                          void *frame, struct fault *out, uint64_t *diverged) {
  sigjmp_buf here;
  if (sigsetjmp(here, 0)) {
    out->signal = fault_signal;
    out->address = fault_address;
    out->item[0] = out->item[1] = out->item[2] = 0;
    return FAULT;
  }
  guard = &here;
  uint64_t r = wg(args, ctx, begin, end, frame);
  guard = 0;
  if (r) {
    *diverged = r - 1;
    return DIVERGENT;
  }
  return OK;
}
