/* Kernel faults on the host become errors, not the end of the process.
 *
 * A kernel is C code running in the process: a null or wild pointer in it raises SIGSEGV (or
 * SIGBUS, SIGFPE, SIGILL). While a worker runs the work items of a block (offload_run_block),
 * the plugin's handler jumps back to that loop's start and the launch fails with the signal and
 * the faulting address, as a GPU's context does after a fault. A signal anywhere else is handed
 * to the handler that was there before (Rust's stack-overflow report, or the default: the
 * process ends as it would have without the plugin). */

#include <ffi.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>

/* Set while this thread runs kernel code. */
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
  /* The default action: end the process with this signal. */
  signal(sig, SIG_DFL);
  raise(sig);
}

/* Installs the handler once (returns 0, or -1 if sigaction failed). */
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

/* The work-item context of the kernel header (its layout is the header's). */
struct context {
  unsigned thread_id[3];
  unsigned block_id[3];
  unsigned block_dim[3];
  unsigned grid_dim[3];
};

struct fault {
  int signal;
  void *address;
  unsigned item[3];
};

/* Calls `fn` once per work item of a block of bx*by*bz, with `ctx` (if any) naming the item.
 * Returns 0, or 1 with `out` filled in when the kernel raised a fault signal. */
int offload_run_block(ffi_cif *cif, void (*fn)(void), void **argv, struct context *ctx,
                      unsigned bx, unsigned by, unsigned bz, struct fault *out) {
  sigjmp_buf here;
  volatile unsigned x = 0, y = 0, z = 0;
  if (sigsetjmp(here, 0)) {
    /* SA_NODEFER: the signal was not blocked for the handler, so nothing needs unblocking. */
    out->signal = fault_signal;
    out->address = fault_address;
    out->item[0] = x;
    out->item[1] = y;
    out->item[2] = z;
    return 1;
  }
  guard = &here;
  for (z = 0; z < bz; ++z)
    for (y = 0; y < by; ++y)
      for (x = 0; x < bx; ++x) {
        if (ctx) {
          ctx->thread_id[0] = x;
          ctx->thread_id[1] = y;
          ctx->thread_id[2] = z;
        }
        ffi_call(cif, fn, 0, argv);
      }
  guard = 0;
  return 0;
}
