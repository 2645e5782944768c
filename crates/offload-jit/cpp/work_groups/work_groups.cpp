// Work-group functions for the host (docs/decisions.md, decision 8), made before the module is
// optimised.
//
// For each kernel K (an exported void function whose parameters are i32, i64, float, double or
// pointers) this adds
//
//     uint64_t __offload_wg_K(const uint64_t *args, offload_host_context *ctx,
//                             uint64_t begin, uint64_t end, void *frame)
//
// which runs every work item of the blocks begin..end (linear block indices, x fastest) of the
// launch described by `ctx` (its grid, block and shared-memory fields), K's arguments unpacked
// from `args` (one 8-byte slot each, as the plugin packs them). It returns 0, or 1 + the linear
// index of a block whose work items reached different barriers. The module also gets
// `__offload_wg_abi` (this calling convention's version, which the plugin checks) and, for a
// kernel in region form (below), `__offload_wgf_K`: the bytes of `frame` it needs per work item.
//
// Without barriers: a loop over the blocks around three nested loops over the work-item IDs, K
// inlined into the innermost. The kernel header's host accessors read the IDs through
// `__offload_host_context()`; here those calls are replaced by a local copy of the context
// whose thread IDs are the loop variables, so after SROA the IDs are loop counters, invariant
// reads leave the loop and the vectoriser sees a plain loop. The inner loop is marked parallel
// (work items of a block are independent between barriers; a data race between them is
// undefined on every GPU too) and vectorisable. The kernel's own stack variables (private
// arrays the optimiser could not promote) are one copy for the whole loop, so accesses to them
// are left out of the parallel marking and the vectoriser judges them itself.
//
// With barriers: K is cut into regions at its barriers, each region a loop nest of its own over
// the work items (see RegionBuilder below), as PoCL does.
//
// Without barriers but with a loop that runs the same runtime number of times for every work
// item (its exits do not depend on the work item; a small divergence analysis decides): an
// implicit barrier at the loop's head, so that the region form runs one iteration for all the
// work items before the next (PoCL's "implicit loop barriers"): the work items' iterations then
// vectorise together (a matrix product's inner loop: 87 -> 20 ms against PoCL's 88). Values
// the same for all work items (the loop counter, a row's base) are kept once per block rather
// than per work item. If the work items part ways at such a barrier after all (one sits in a
// branch only some take), each runs on alone ("solo") to its end, which a barrier-free kernel
// allows. Only when little lives across the loop's head (at most MAX_IMPLICIT_CROSSING values
// per work item) and the kernel has no stack variables; else the plain loop nest.
//
// A kernel is left to the per-work-item path (no work-group function; fibers if it has
// barriers) when, after inlining, it still reaches the context or the barrier other than
// through those calls (an un-inlinable function that reads an ID, a call through a pointer), or
// when its regions cannot be formed (a variable-sized stack allocation, setjmp, exceptions,
// more than 256 barriers, a region form too large).
#include "work_groups.h"

#include "llvm-c/Core.h"

using namespace offload_wg;

// Adds the work-group functions; returns how many were made.
extern "C" int offload_jit_make_work_groups(LLVMModuleRef module_ref) {
  Module &m = *unwrap(module_ref);
  GlobalVariable *ctx_var = m.getNamedGlobal("__offload_host_context");
  if (!ctx_var)
    return 0;
  LLVMContext &c = m.getContext();
  Type *i32 = Type::getInt32Ty(c);
  ArrayType *a3 = ArrayType::get(i32, 3);
  Host h{m, ctx_var, m.getNamedGlobal("__offload_host_barrier"),
         StructType::get(c, {a3, a3, a3, a3, PointerType::get(c, 0), i32, i32})};
  std::vector<Function *> kernels;
  for (Function &f : m) {
    if (f.isDeclaration() || f.hasLocalLinkage() ||
        f.getVisibility() != GlobalValue::DefaultVisibility || f.isVarArg() ||
        !f.getReturnType()->isVoidTy() || f.getName().starts_with("__offload"))
      continue;
    bool ok = true;
    for (const Argument &a : f.args())
      ok &= supported_param(a);
    if (ok)
      kernels.push_back(&f);
  }
  std::set<const Function *> barrier_users;
  if (h.barrier_var)
    barrier_users = context_users(m, {h.barrier_var});
  int made = 0;
  for (Function *k : kernels) {
    // Kernels with barriers: regions. Without: regions at implicit barriers if the kernel has a
    // loop that gains from them, else the plain loop nest.
    bool ok = barrier_users.count(k) ? make_region_work_group(h, k)
                                     : make_region_work_group(h, k) || make_plain_work_group(h, k);
    made += ok ? 1 : 0;
  }
  if (made > 0) {
    auto *abi = ConstantInt::get(i32, ABI_VERSION);
    auto *g = new GlobalVariable(m, i32, true, GlobalValue::ExternalLinkage, abi,
                                 "__offload_wg_abi");
    g->setVisibility(GlobalValue::DefaultVisibility);
  }
  return made;
}
