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
#include "llvm/Analysis/CaptureTracking.h"
#include "llvm/Analysis/LoopInfo.h"
#include "llvm/Analysis/ValueTracking.h"
#include "llvm/IR/Constants.h"
#include "llvm/IR/DebugInfo.h"
#include "llvm/IR/Dominators.h"
#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/Instructions.h"
#include "llvm/IR/IntrinsicInst.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/MDBuilder.h"
#include "llvm/IR/Module.h"
#include "llvm/IR/Verifier.h"
#include "llvm/Transforms/Utils/Cloning.h"
#include "llvm/Transforms/Utils/Local.h"
#include "llvm/Transforms/Utils/ValueMapper.h"
#include "llvm-c/Core.h"

#include "item_bounds.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

using namespace llvm;

namespace {

// What the plugin checks before it calls a work-group function (`__offload_wg_abi`).
constexpr unsigned ABI_VERSION = 2;
// The region number of "returned" (no more barriers).
constexpr uint32_t DONE = 0xffffffffu;
// Limits of the region form: beyond them a kernel keeps the fiber path.
constexpr size_t MAX_REGIONS = 256;
constexpr size_t MAX_CLONED_INSTRUCTIONS = 200000;
constexpr uint64_t MAX_FRAME_ALIGN = 64;
// Most per-work-item values an implicit (loop) barrier may carry.
constexpr size_t MAX_IMPLICIT_CROSSING = 8;
// Most loops given implicit barriers in one kernel, and the largest kernel (instructions after
// inlining) that gets them: each barrier is a region with its own loop nest, and a kernel with
// hundreds of them (a hundred inlined helper loops) took LLVM 38 s to optimise against 0.4 s
// for the plain nest.
constexpr size_t MAX_IMPLICIT_LOOPS = 8;
constexpr size_t MAX_IMPLICIT_INSTRUCTIONS = 4000;

struct Host {
  Module &m;
  GlobalVariable *ctx_var;
  GlobalVariable *barrier_var; // null when the module never calls offload_barrier()
  StructType *ctx_type;
};

bool supported_param(const Argument &a) {
  Type *t = a.getType();
  if (a.hasByValAttr() || a.hasStructRetAttr() || a.hasInAllocaAttr() || a.hasPreallocatedAttr())
    return false;
  return t->isIntegerTy(32) || t->isIntegerTy(64) || t->isFloatTy() || t->isDoubleTy() ||
         t->isPointerTy();
}

// Functions that read the context or the barrier, directly or through calls.
std::set<const Function *> context_users(Module &m, const std::vector<const GlobalValue *> &vars) {
  std::set<const Function *> users;
  for (const GlobalValue *v : vars)
    for (const User *u : v->users())
      if (const auto *i = dyn_cast<Instruction>(u))
        users.insert(i->getFunction());
  bool grew = true;
  while (grew) {
    grew = false;
    for (Function &f : m)
      if (!users.count(&f))
        for (const BasicBlock &bb : f)
          for (const Instruction &i : bb)
            if (const auto *c = dyn_cast<CallBase>(&i))
              if (const Function *callee = c->getCalledFunction(); callee && users.count(callee)) {
                users.insert(&f);
                grew = true;
              }
  }
  return users;
}

// `void|i64 __offload_wg_K(ptr args, ptr ctx, i64 begin, i64 end, ptr frame)`, empty.
Function *declare_work_group(Module &m, Function *k) {
  LLVMContext &c = m.getContext();
  Type *i64 = Type::getInt64Ty(c);
  Type *ptr = PointerType::get(c, 0);
  FunctionType *type = FunctionType::get(i64, {ptr, ptr, i64, i64, ptr}, false);
  Function *wg = Function::Create(type, GlobalValue::ExternalLinkage,
                                  ("__offload_wg_" + k->getName()).str(), m);
  wg->setVisibility(GlobalValue::DefaultVisibility);
  for (const char *attr : {"target-cpu", "target-features", "tune-cpu"})
    if (k->hasFnAttribute(attr))
      wg->addFnAttr(k->getFnAttribute(attr));
  wg->addFnAttr(Attribute::NoUnwind);
  for (unsigned i : {0u, 1u, 4u})
    wg->getArg(i)->addAttr(Attribute::NoAlias);
  return wg;
}

// K's arguments, unpacked from the 8-byte slots at `args`.
std::vector<Value *> unpack_arguments(IRBuilder<> &b, Function *k, Value *args) {
  Type *i32 = b.getInt32Ty();
  Type *i64 = b.getInt64Ty();
  std::vector<Value *> values;
  unsigned slot = 0;
  for (Argument &a : k->args()) {
    Value *bits = b.CreateLoad(i64, b.CreateConstInBoundsGEP1_64(i64, args, slot++));
    Type *t = a.getType();
    Value *v;
    if (t->isIntegerTy(32))
      v = b.CreateTrunc(bits, i32);
    else if (t->isIntegerTy(64))
      v = bits;
    else if (t->isFloatTy())
      v = b.CreateBitCast(b.CreateTrunc(bits, i32), t);
    else if (t->isDoubleTy())
      v = b.CreateBitCast(bits, t);
    else
      v = b.CreateIntToPtr(bits, t);
    values.push_back(v);
  }
  return values;
}

// Inlines, as far as possible, every call to a function with a body (not `f` itself).
void inline_callees(Function *f) {
  for (int round = 0; round < 16; ++round) {
    std::vector<CallBase *> calls;
    for (BasicBlock &bb : *f)
      for (Instruction &i : bb)
        if (auto *cb = dyn_cast<CallBase>(&i))
          if (Function *callee = cb->getCalledFunction();
              callee && !callee->isDeclaration() && callee != f && !callee->isIntrinsic())
            calls.push_back(cb);
    if (calls.empty())
      return;
    bool inlined = false;
    for (CallBase *cb : calls) {
      InlineFunctionInfo info;
      inlined |= InlineFunction(*cb, info).isSuccess();
    }
    if (!inlined)
      return;
  }
}

// Calls through `var` (the header's `__offload_host_context()` or `__offload_host_barrier()`).
std::vector<CallBase *> calls_through(Function *f, GlobalVariable *var) {
  std::vector<CallBase *> calls;
  if (!var)
    return calls;
  for (BasicBlock &bb : *f)
    for (Instruction &i : bb)
      if (auto *cb = dyn_cast<CallBase>(&i))
        if (auto *load = dyn_cast<LoadInst>(cb->getCalledOperand());
            load && load->getPointerOperand() == var)
          calls.push_back(cb);
  return calls;
}

// Loads of `var` nobody uses any more.
void erase_dead_loads(Function *f, GlobalVariable *var) {
  std::vector<Instruction *> dead;
  for (BasicBlock &bb : *f)
    for (Instruction &i : bb)
      if (auto *load = dyn_cast<LoadInst>(&i);
          load && load->getPointerOperand() == var && load->use_empty())
        dead.push_back(load);
  for (Instruction *i : dead)
    i->eraseFromParent();
}

// `__offload_host_context()` → `with`.
void replace_context_calls(Function *f, GlobalVariable *ctx_var, Value *with) {
  for (CallBase *cb : calls_through(f, ctx_var)) {
    cb->replaceAllUsesWith(with);
    cb->eraseFromParent();
  }
  erase_dead_loads(f, ctx_var);
}

// Whether `f` still reaches the context or the barrier other than as it should, or calls
// through a pointer: then it cannot become (part of) a work-group function.
bool still_reaches_context(Function *f, const Host &h, const std::set<const Function *> &users) {
  for (BasicBlock &bb : *f)
    for (Instruction &i : bb) {
      for (const Value *op : i.operands())
        if (op == h.ctx_var || (h.barrier_var && op == h.barrier_var))
          return true;
      if (auto *cb = dyn_cast<CallBase>(&i)) {
        const Function *callee = cb->getCalledFunction();
        if (!callee && !cb->isInlineAsm())
          return true;
        if (callee && users.count(callee))
          return true;
      }
    }
  return false;
}

} // namespace

// Whether `i` may access one of its function's stack variables (or a pointer into one). The
// kernel's own stack variables (private arrays) are one copy for all the work items of a plain
// loop nest, so accesses to them carry dependences from work item to work item.
bool may_access_stack(const Instruction &i) {
  for (const Value *op : i.operands()) {
    if (!op->getType()->isPtrOrPtrVectorTy())
      continue;
    SmallVector<const Value *, 4> objects;
    getUnderlyingObjects(op, objects);
    for (const Value *o : objects)
      if (isa<AllocaInst>(o) || isa<PHINode>(o) || isa<SelectInst>(o))
        return true; // (a phi or select left is one the search gave up on)
  }
  return false;
}

namespace {

// Marks the loop of `latch` as one whose iterations (work items) are independent, so the
// vectoriser may run across them: every memory access in `body` joins the loop's access group,
// except those to the function's own stack variables (whose dependences the vectoriser then
// sees for itself; variables it promotes to registers drop out). If a stack variable's address
// escapes, no access is known to be free of it and the loop is left unmarked.
void mark_parallel(LLVMContext &c, const std::vector<BasicBlock *> &body, BranchInst *latch) {
  for (Instruction &i : latch->getFunction()->getEntryBlock())
    if (auto *a = dyn_cast<AllocaInst>(&i); a && PointerMayBeCaptured(a, true, true))
      return;
  MDNode *group = MDNode::getDistinct(c, {});
  for (BasicBlock *bb : body)
    for (Instruction &i : *bb)
      if (i.mayReadOrWriteMemory() && !may_access_stack(i))
        i.setMetadata(LLVMContext::MD_access_group, group);
  MDNode *parallel = MDNode::get(c, {MDString::get(c, "llvm.loop.parallel_accesses"), group});
  MDNode *vectorize = MDNode::get(
      c, {MDString::get(c, "llvm.loop.vectorize.enable"),
          ConstantAsMetadata::get(ConstantInt::getTrue(c))});
  MDNode *loop = MDNode::getDistinct(c, {nullptr, parallel, vectorize});
  loop->replaceOperandWith(0, loop);
  latch->setMetadata(LLVMContext::MD_loop, loop);
}

Value *field(IRBuilder<> &at, StructType *ctx_type, Value *base, unsigned f, unsigned d) {
  return at.CreateInBoundsGEP(ctx_type, base, {at.getInt32(0), at.getInt32(f), at.getInt32(d)});
}

// The launch as a work-group function reads it in its entry block: a local copy of the context
// `block` (whose IDs the function sets), the block's size and the grid's x and y extents.
struct LaunchShape {
  AllocaInst *local;
  Value *bx, *by, *bz; // i32
  Value *gx, *gy, *gxy; // i64
};
LaunchShape read_launch_shape(IRBuilder<> &b, StructType *ctx_type, const DataLayout &dl,
                              Value *block) {
  Type *i32 = b.getInt32Ty();
  Type *i64 = b.getInt64Ty();
  LaunchShape s;
  s.local = b.CreateAlloca(ctx_type, nullptr, "ctx");
  b.CreateMemCpy(s.local, Align(8), block, Align(8), dl.getTypeAllocSize(ctx_type));
  s.bx = b.CreateLoad(i32, field(b, ctx_type, block, 2, 0), "bx");
  s.by = b.CreateLoad(i32, field(b, ctx_type, block, 2, 1), "by");
  s.bz = b.CreateLoad(i32, field(b, ctx_type, block, 2, 2), "bz");
  s.gx = b.CreateZExt(b.CreateLoad(i32, field(b, ctx_type, block, 3, 0), "gx"), i64);
  s.gy = b.CreateZExt(b.CreateLoad(i32, field(b, ctx_type, block, 3, 1), "gy"), i64);
  s.gxy = b.CreateMul(s.gx, s.gy, "gxy", true, true);
  return s;
}

// The block of linear index `bl` (x fastest) as the local context's block ID.
void set_block_id(IRBuilder<> &b, StructType *ctx_type, const LaunchShape &s, Value *bl) {
  Type *i32 = b.getInt32Ty();
  b.CreateStore(b.CreateTrunc(b.CreateURem(bl, s.gx), i32), field(b, ctx_type, s.local, 1, 0));
  b.CreateStore(b.CreateTrunc(b.CreateURem(b.CreateUDiv(bl, s.gx), s.gy), i32),
                field(b, ctx_type, s.local, 1, 1));
  b.CreateStore(b.CreateTrunc(b.CreateUDiv(bl, s.gxy), i32), field(b, ctx_type, s.local, 1, 2));
}

// The heads of the three loops over a block's work items: z in `zb` (entered from `from`), y in
// `yb`, x in `xb`, each counting from 0, and the thread IDs of the local context `local` set
// from them. Leaves `b` at the end of `xb`; the caller adds the latches.
struct ItemLoops {
  PHINode *x, *y, *z;
};
ItemLoops open_item_loops(IRBuilder<> &b, StructType *ctx_type, Value *local, BasicBlock *from,
                          BasicBlock *zb, BasicBlock *yb, BasicBlock *xb) {
  Type *i32 = b.getInt32Ty();
  b.SetInsertPoint(zb);
  PHINode *z = b.CreatePHI(i32, 2, "z");
  z->addIncoming(b.getInt32(0), from);
  b.CreateBr(yb);
  b.SetInsertPoint(yb);
  PHINode *y = b.CreatePHI(i32, 2, "y");
  y->addIncoming(b.getInt32(0), zb);
  b.CreateBr(xb);
  b.SetInsertPoint(xb);
  PHINode *x = b.CreatePHI(i32, 2, "x");
  x->addIncoming(b.getInt32(0), yb);
  b.CreateStore(x, field(b, ctx_type, local, 0, 0));
  b.CreateStore(y, field(b, ctx_type, local, 0, 1));
  b.CreateStore(z, field(b, ctx_type, local, 0, 2));
  return {x, y, z};
}

// ---- kernels without barriers: one loop nest, the kernel inlined ---------------------------

bool make_plain_work_group(const Host &h, Function *k) {
  Module &m = h.m;
  LLVMContext &c = m.getContext();
  const DataLayout &dl = m.getDataLayout();
  StructType *ctx_type = h.ctx_type;
  Type *i32 = Type::getInt32Ty(c);
  Type *i64 = Type::getInt64Ty(c);
  Function *wg = declare_work_group(m, k);
  Argument *args = wg->getArg(0);
  Argument *block = wg->getArg(1);
  Argument *begin = wg->getArg(2);
  Argument *end = wg->getArg(3);

  BasicBlock *entry = BasicBlock::Create(c, "entry", wg);
  BasicBlock *bbody = BasicBlock::Create(c, "wg.block", wg);
  BasicBlock *zbody = BasicBlock::Create(c, "wi.z", wg);
  BasicBlock *ybody = BasicBlock::Create(c, "wi.y", wg);
  BasicBlock *xbody = BasicBlock::Create(c, "wi.x", wg);
  BasicBlock *ylatch = BasicBlock::Create(c, "wi.y.next", wg);
  BasicBlock *zlatch = BasicBlock::Create(c, "wi.z.next", wg);
  BasicBlock *blatch = BasicBlock::Create(c, "wg.block.next", wg);
  BasicBlock *exit = BasicBlock::Create(c, "wg.done", wg);

  IRBuilder<> b(entry);
  LaunchShape shape = read_launch_shape(b, ctx_type, dl, block);
  AllocaInst *local = shape.local;
  Value *bx = shape.bx, *by = shape.by, *bz = shape.bz;
  std::vector<Value *> values = unpack_arguments(b, k, args);
  b.CreateBr(bbody);

  // The block: its linear index → its ID, in the local context.
  b.SetInsertPoint(bbody);
  PHINode *bl = b.CreatePHI(i64, 2, "block");
  bl->addIncoming(begin, entry);
  set_block_id(b, ctx_type, shape, bl);
  b.CreateBr(zbody);

  auto [x, y, z] = open_item_loops(b, ctx_type, local, bbody, zbody, ybody, xbody);
  CallInst *call = b.CreateCall(k, values);
  call->setCallingConv(k->getCallingConv());
  Value *x1 = b.CreateAdd(x, b.getInt32(1), "x.next", true, true);
  auto *xcmp = cast<ICmpInst>(b.CreateICmpULT(x1, bx));
  b.CreateCondBr(xcmp, xbody, ylatch);
  x->addIncoming(x1, xbody);

  b.SetInsertPoint(ylatch);
  Value *y1 = b.CreateAdd(y, b.getInt32(1), "y.next", true, true);
  b.CreateCondBr(b.CreateICmpULT(y1, by), ybody, zlatch);
  y->addIncoming(y1, ylatch);

  b.SetInsertPoint(zlatch);
  Value *z1 = b.CreateAdd(z, b.getInt32(1), "z.next", true, true);
  b.CreateCondBr(b.CreateICmpULT(z1, bz), zbody, blatch);
  z->addIncoming(z1, zlatch);

  b.SetInsertPoint(blatch);
  Value *bl1 = b.CreateAdd(bl, b.getInt64(1), "block.next", true, true);
  b.CreateCondBr(b.CreateICmpULT(bl1, end), bbody, exit);
  bl->addIncoming(bl1, blatch);

  b.SetInsertPoint(exit);
  b.CreateRet(b.getInt64(0));

  // The kernel and, as far as possible, what it calls, inlined into the loop.
  {
    InlineFunctionInfo info;
    if (!InlineFunction(*call, info).isSuccess()) {
      wg->eraseFromParent();
      return false;
    }
  }
  inline_callees(wg);
  replace_context_calls(wg, h.ctx_var, local);

  std::vector<const GlobalValue *> vars{h.ctx_var};
  if (h.barrier_var)
    vars.push_back(h.barrier_var);
  if (still_reaches_context(wg, h, context_users(m, vars))) {
    wg->eraseFromParent();
    return false;
  }

  // The inner loop. Its back edge is now at the end of the inlined body (the branch moved with
  // the split): the branch that targets `xbody` from inside the loop.
  std::set<BasicBlock *> outside{entry, bbody, zbody, ybody, ylatch, zlatch, blatch, exit};
  std::vector<BasicBlock *> inner;
  BranchInst *latch = nullptr;
  for (BasicBlock &bb : *wg) {
    if (outside.count(&bb))
      continue;
    inner.push_back(&bb);
    if (auto *br = dyn_cast<BranchInst>(bb.getTerminator()))
      for (BasicBlock *succ : br->successors())
        if (succ == xbody)
          latch = br;
  }
  if (latch) {
    mark_parallel(c, inner, latch);
    bound_item_loop({ybody, xbody, ylatch, x, y, z, latch, xcmp, bx, local});
  }
  return true;
}

// ---- kernels with barriers: regions between barriers, one loop nest each ----------------------
//
// The kernel K (inlined into a copy, the "body") is cut at each barrier. Region 0 starts at
// K's entry, region j at the instruction after barrier j; a region is every block reachable
// from its start without passing a barrier. The work-group function runs, per block, region 0
// for every work item, then the region all of them stopped before (the same for all, or the
// block is reported as divergent), and so on until all returned. Each region is a copy of its
// blocks inside its own loop nest over the work items; a value that one region computes and
// another (or a later pass through the same one) uses is kept per work item in the frame (see
// below), as are K's own stack variables. Loops inside a region are cloned with it; barriers
// inside loops work because the region that ends at a barrier is entered again after it.
//
// The frame: per work item, every stack variable of K and every value that crosses a barrier,
// laid out as arrays over the block's work items (`frame + off * items + item * size`, largest
// alignment first), `__offload_wgf_K` bytes per work item; the plugin passes one per worker.

struct Region {
  BasicBlock *root = nullptr;
  std::vector<BasicBlock *> rpo;
  std::set<BasicBlock *> in;
  std::map<BasicBlock *, BasicBlock *> idom;
  std::map<BasicBlock *, unsigned> post; // postorder numbers
};

bool region_dominates(const Region &r, BasicBlock *a, BasicBlock *b) {
  for (;;) {
    if (a == b)
      return true;
    auto it = r.idom.find(b);
    if (it == r.idom.end() || it->second == b)
      return false;
    b = it->second;
  }
}

// Blocks reachable from `root` without entering a barrier block, and their dominators in that
// subgraph (Cooper, Harvey and Kennedy's iteration).
void build_region(Region &r, const std::map<BasicBlock *, unsigned> &barrier_index) {
  std::vector<std::pair<BasicBlock *, unsigned>> stack{{r.root, 0}};
  std::vector<BasicBlock *> postorder;
  r.in.insert(r.root);
  while (!stack.empty()) {
    auto &[bb, next] = stack.back();
    Instruction *t = bb->getTerminator();
    if (next < t->getNumSuccessors()) {
      BasicBlock *s = t->getSuccessor(next++);
      if (!barrier_index.count(s) && r.in.insert(s).second)
        stack.push_back({s, 0});
    } else {
      r.post[bb] = postorder.size();
      postorder.push_back(bb);
      stack.pop_back();
    }
  }
  r.rpo.assign(postorder.rbegin(), postorder.rend());
  r.idom[r.root] = r.root;
  bool changed = true;
  while (changed) {
    changed = false;
    for (BasicBlock *bb : r.rpo) {
      if (bb == r.root)
        continue;
      BasicBlock *best = nullptr;
      for (BasicBlock *p : predecessors(bb)) {
        if (!r.in.count(p) || !r.idom.count(p))
          continue;
        if (!best) {
          best = p;
          continue;
        }
        BasicBlock *f1 = p, *f2 = best;
        while (f1 != f2) {
          while (r.post.at(f1) < r.post.at(f2))
            f1 = r.idom.at(f1);
          while (r.post.at(f2) < r.post.at(f1))
            f2 = r.idom.at(f2);
        }
        best = f1;
      }
      if (best && r.idom[bb] != best) {
        r.idom[bb] = best;
        changed = true;
      }
    }
  }
}

// A use of a value that must come from the frame: operand `op` of `user` (for a phi, incoming
// `op`), in region `region`.
struct FrameUse {
  unsigned region;
  Instruction *user;
  unsigned op;
  bool remat;   // recomputed at the head of the region's loop instead
  bool uniform; // the same for every work item: read once per pass (see `uniform_ok`)
};

struct FrameEntry {
  Instruction *value; // an alloca, or a value crossing a barrier
  uint64_t size, align, offset = 0;
  Value *base = nullptr; // frame + offset * items, in the work-group function
};

class RegionBuilder {
public:
  RegionBuilder(const Host &h, Function *k) : h(h), k(k), m(h.m), c(h.m.getContext()) {}
  ~RegionBuilder() {
    if (body)
      body->eraseFromParent();
    if (marker)
      marker->eraseFromParent();
  }
  bool run();

private:
  bool make_body();
  bool find_regions();
  bool find_frame();
  bool build();
  Value *slot(IRBuilder<> &b, Instruction *v, Value *item);
  bool rematerializable(Value *v, unsigned &budget);
  Value *rematerialize(IRBuilder<> &b, Value *v, ValueToValueMapTy &vm,
                       std::map<Value *, Value *> &done);
  void find_divergence();
  bool add_loop_barriers();

  const Host &h;
  Function *k;
  Module &m;
  LLVMContext &c;
  Function *body = nullptr;
  Function *marker = nullptr;
  Function *wg = nullptr;
  std::vector<BasicBlock *> barrier_block{nullptr}; // [j] for barrier j >= 1
  std::map<BasicBlock *, unsigned> barrier_index;
  std::vector<Region> regions;
  std::vector<AllocaInst *> allocas;
  std::vector<FrameUse> frame_uses;
  std::vector<FrameEntry> frame;
  std::map<Instruction *, size_t> frame_index;
  std::map<Value *, bool> remat_memo;
  bool context_read_only = false;
  uint64_t frame_bytes = 0;
  // No real barriers: the barriers are implicit ones at the heads of uniform loops, and work
  // items that part ways at one go on alone ("solo"), each to its end.
  bool implicit = false;
  // Values that may differ between the work items of a block.
  std::set<Value *> divergent;
  // Crossing values every work item holds the same copy of after every pass of a region (see
  // find_frame); in the region loops they are read once per pass, as scalars.
  std::set<Instruction *> uniform_ok;
  size_t next_entry = 0; // frame entry of each work item's next region (implicit barriers)
};

// Which values may differ between the work items of a block: the thread IDs, what is loaded
// from memory or private to a work item, what depends on those, and phis where paths that
// work items take differently meet (a conservative reading of GPU divergence analysis). Run
// on the body before it is cut.
void RegionBuilder::find_divergence() {
  const DataLayout &dl = m.getDataLayout();
  Argument *ctx = body->getArg(k->arg_size());
  DominatorTree dt(*body);
  LoopInfo li(dt);
  auto seed = [&](Instruction &i) -> bool {
    if (auto *load = dyn_cast<LoadInst>(&i)) {
      APInt offset(dl.getIndexTypeSizeInBits(load->getPointerOperandType()), 0);
      Value *base =
          load->getPointerOperand()->stripAndAccumulateConstantOffsets(dl, offset, true);
      // The context's fields after the thread IDs (block IDs and sizes, grid, shared memory)
      // are the same for the whole block.
      return !(base == ctx && context_read_only && !load->isVolatile() && !load->isAtomic() &&
               offset.getZExtValue() >= 12);
    }
    if (isa<AllocaInst>(i) || isa<AtomicRMWInst>(i) || isa<AtomicCmpXchgInst>(i) ||
        isa<VAArgInst>(i) || isa<LandingPadInst>(i))
      return true;
    if (auto *cb = dyn_cast<CallBase>(&i)) {
      auto *ii = dyn_cast<IntrinsicInst>(cb);
      bool pure = ii && (ii->getIntrinsicID() == Intrinsic::threadlocal_address ||
                         (!ii->mayReadOrWriteMemory() && !ii->mayHaveSideEffects()));
      return !pure && !cb->getType()->isVoidTy();
    }
    return false;
  };
  for (BasicBlock &bb : *body)
    for (Instruction &i : bb)
      if (seed(i))
        divergent.insert(&i);
  // Blocks reachable from each block (for joins).
  auto reach = [&](BasicBlock *from) {
    std::set<BasicBlock *> seen;
    std::vector<BasicBlock *> work{from};
    while (!work.empty()) {
      BasicBlock *b = work.back();
      work.pop_back();
      if (!seen.insert(b).second)
        continue;
      for (BasicBlock *s : successors(b))
        work.push_back(s);
    }
    return seen;
  };
  std::set<BasicBlock *> joins;
  std::set<Instruction *> branch_done;
  bool changed = true;
  while (changed) {
    changed = false;
    for (BasicBlock &bb : *body)
      for (Instruction &i : bb) {
        if (divergent.count(&i))
          continue;
        bool d = false;
        if (auto *phi = dyn_cast<PHINode>(&i))
          d = joins.count(&bb) > 0;
        for (Value *op : i.operands())
          d = d || divergent.count(op);
        if (d && !i.getType()->isVoidTy()) {
          divergent.insert(&i);
          changed = true;
        }
        // A branch on a divergent condition: its joins, and the values its loop gives out.
        Instruction *t = bb.getTerminator();
        if (&i != t || branch_done.count(t) || t->getNumSuccessors() < 2)
          continue;
        Value *cond = nullptr;
        if (auto *br = dyn_cast<BranchInst>(t); br && br->isConditional())
          cond = br->getCondition();
        else if (auto *sw = dyn_cast<SwitchInst>(t))
          cond = sw->getCondition();
        if (!cond || !divergent.count(cond))
          continue;
        branch_done.insert(t);
        changed = true;
        std::map<BasicBlock *, unsigned> hits;
        std::set<BasicBlock *> succs(succ_begin(&bb), succ_end(&bb));
        for (BasicBlock *s : succs)
          for (BasicBlock *r : reach(s))
            ++hits[r];
        for (auto &[r, n] : hits)
          if (n > 1)
            joins.insert(r);
        // Work items leave this loop after different iterations: what it computes and is used
        // after it differs.
        if (Loop *l = li.getLoopFor(&bb); l && l->isLoopExiting(&bb))
          for (BasicBlock *lb : l->blocks())
            for (Instruction &v : *lb)
              for (User *u : v.users())
                if (auto *ui = dyn_cast<Instruction>(u);
                    ui && !l->contains(ui->getParent()) && !v.getType()->isVoidTy())
                  divergent.insert(&v);
      }
  }
}

// Implicit barriers at the head of each outermost loop that has no loop inside, runs the same
// number of times for every work item (its exits are uniform), and is not a small constant
// count (which LLVM unrolls and vectorises already): a pass of its region then runs one
// iteration for every work item, so the work items' iterations interleave and vectorise
// (matrix products, per-item sums). Returns whether any was added.
bool RegionBuilder::add_loop_barriers() {
  DominatorTree dt(*body);
  LoopInfo li(dt);
  std::vector<Instruction *> at;
  for (Loop *l : li.getTopLevelLoops()) {
    if (!l->getSubLoops().empty() || !l->getLoopPreheader() || !l->getLoopLatch())
      continue;
    bool ok = true, runtime_count = false;
    SmallVector<BasicBlock *, 4> exiting;
    l->getExitingBlocks(exiting);
    for (BasicBlock *e : exiting) {
      auto *br = dyn_cast<BranchInst>(e->getTerminator());
      if (!br || !br->isConditional() || divergent.count(br->getCondition())) {
        ok = false;
        break;
      }
      if (auto *cmp = dyn_cast<CmpInst>(br->getCondition()))
        for (Value *op : cmp->operands())
          if (!isa<Constant>(op) && !l->contains(dyn_cast<Instruction>(op)))
            runtime_count = true; // compared with something computed outside the loop
    }
    for (BasicBlock *b : l->blocks())
      for (Instruction &i : *b)
        if (auto *cb = dyn_cast<CallBase>(&i); cb && !isa<IntrinsicInst>(cb))
          ok = false; // calls stay where the plain loop has them
    if (ok && runtime_count)
      at.push_back(&*l->getHeader()->getFirstInsertionPt());
  }
  size_t instructions = 0;
  for (BasicBlock &bb : *body)
    instructions += bb.size();
  if (at.size() > MAX_IMPLICIT_LOOPS || instructions > MAX_IMPLICIT_INSTRUCTIONS)
    return false;
  for (Instruction *i : at)
    CallInst::Create(marker, {}, "", i->getIterator());
  return !at.empty();
}

// Whether `v` can be computed again, with the same value, at the head of any region's loop:
// from K's arguments, the context (which a block does not change; the work item's IDs are set
// at the head), the address of a thread-local variable (block-shared memory) and pure
// operations on those. Such values (IDs, indices, addresses in shared memory) are recomputed
// rather than kept in the frame, so the vectoriser sees them for what they are. `budget` bounds
// the instructions of one expression.
bool RegionBuilder::rematerializable(Value *v, unsigned &budget) {
  if (isa<Argument>(v) || isa<Constant>(v))
    return true;
  auto *i = dyn_cast<Instruction>(v);
  if (!i || isa<AllocaInst>(i))
    return false;
  if (auto it = remat_memo.find(v); it != remat_memo.end())
    return it->second;
  if (budget == 0)
    return false;
  --budget;
  bool ok = false;
  if (auto *load = dyn_cast<LoadInst>(i)) {
    Value *base = load->getPointerOperand()->stripInBoundsOffsets();
    ok = context_read_only && !load->isVolatile() && !load->isAtomic() &&
         base == body->getArg(k->arg_size()) &&
         rematerializable(load->getPointerOperand(), budget);
  } else if (auto *ii = dyn_cast<IntrinsicInst>(i)) {
    ok = ii->getIntrinsicID() == Intrinsic::threadlocal_address ||
         (!ii->mayReadOrWriteMemory() && !ii->mayHaveSideEffects() && !ii->isConvergent() &&
          ii->willReturn());
    for (unsigned o = 0; ok && o < ii->arg_size(); ++o)
      ok = rematerializable(ii->getArgOperand(o), budget);
  } else if (isa<BinaryOperator>(i) || isa<CastInst>(i) || isa<GetElementPtrInst>(i) ||
             isa<CmpInst>(i) || isa<SelectInst>(i) || isa<UnaryOperator>(i)) {
    ok = true;
    for (Value *op : i->operands())
      ok = ok && rematerializable(op, budget);
  }
  if (ok || budget > 0)
    remat_memo[v] = ok; // (a verdict cut short by the budget is not remembered)
  return ok;
}

// `v` computed again at `b` (the head of a region's loop body).
Value *RegionBuilder::rematerialize(IRBuilder<> &b, Value *v, ValueToValueMapTy &vm,
                                    std::map<Value *, Value *> &done) {
  if (isa<Constant>(v))
    return v;
  if (isa<Argument>(v))
    return vm[v];
  if (auto it = done.find(v); it != done.end())
    return it->second;
  auto *i = cast<Instruction>(v);
  Instruction *copy = i->clone();
  for (unsigned o = 0; o < i->getNumOperands(); ++o) {
    Value *op = i->getOperand(o);
    if (!isa<Function>(op) && !isa<BasicBlock>(op))
      copy->setOperand(o, rematerialize(b, op, vm, done));
  }
  b.Insert(copy, i->getName());
  done[v] = copy;
  return copy;
}

// The body: K with the context as one more parameter, its callees inlined, its barriers calls
// to `marker` at the start of their own block.
bool RegionBuilder::make_body() {
  Type *ptr = PointerType::get(c, 0);
  std::vector<Type *> params(k->getFunctionType()->param_begin(),
                             k->getFunctionType()->param_end());
  params.push_back(ptr);
  body = Function::Create(FunctionType::get(Type::getVoidTy(c), params, false),
                          GlobalValue::InternalLinkage, "__offload_wg_body", m);
  ValueToValueMapTy vm;
  for (unsigned i = 0; i < k->arg_size(); ++i)
    vm[k->getArg(i)] = body->getArg(i);
  SmallVector<ReturnInst *, 4> returns;
  CloneFunctionInto(body, k, vm, CloneFunctionChangeType::LocalChangesOnly, returns);
  inline_callees(body);
  stripDebugInfo(*body);
  replace_context_calls(body, h.ctx_var, body->getArg(k->arg_size()));
  marker = Function::Create(FunctionType::get(Type::getVoidTy(c), false),
                            GlobalValue::ExternalLinkage, "__offload_wg_barrier", m);
  std::vector<CallBase *> barriers = calls_through(body, h.barrier_var);
  implicit = barriers.empty();
  for (CallBase *cb : barriers) {
    if (!isa<CallInst>(cb))
      return false;
    CallInst::Create(marker, {}, "", cb->getIterator());
    cb->eraseFromParent();
  }
  if (h.barrier_var)
    erase_dead_loads(body, h.barrier_var);
  removeUnreachableBlocks(*body);

  std::vector<const GlobalValue *> vars{h.ctx_var};
  if (h.barrier_var)
    vars.push_back(h.barrier_var);
  if (still_reaches_context(body, h, context_users(m, vars)))
    return false;
  std::vector<Instruction *> lifetimes;
  for (BasicBlock &bb : *body)
    for (Instruction &i : bb) {
      if (isa<InvokeInst>(i) || isa<CallBrInst>(i) || isa<IndirectBrInst>(i))
        return false;
      if (auto *a = dyn_cast<AllocaInst>(&i)) {
        if (!a->isStaticAlloca() || a->getParent() != &body->getEntryBlock())
          return false;
        allocas.push_back(a);
      }
      if (auto *ii = dyn_cast<IntrinsicInst>(&i)) {
        if (ii->isLifetimeStartOrEnd())
          lifetimes.push_back(ii);
        switch (ii->getIntrinsicID()) {
        case Intrinsic::stacksave:
        case Intrinsic::stackrestore:
        case Intrinsic::localescape:
        case Intrinsic::vastart:
          return false;
        default:
          break;
        }
      }
      if (auto *cb = dyn_cast<CallBase>(&i))
        if (cb->hasFnAttr(Attribute::ReturnsTwice))
          return false;
    }
  for (Instruction *i : lifetimes)
    i->eraseFromParent();

  // The context is read-only if nothing but loads (through address arithmetic) reads it.
  context_read_only = true;
  {
    std::vector<Value *> work{body->getArg(k->arg_size())};
    while (!work.empty() && context_read_only) {
      Value *p = work.back();
      work.pop_back();
      for (User *u : p->users()) {
        if (auto *gep = dyn_cast<GetElementPtrInst>(u); gep && gep->getPointerOperand() == p)
          work.push_back(gep);
        else if (!isa<LoadInst>(u))
          context_read_only = false;
      }
    }
  }
  find_divergence();
  if (implicit && !add_loop_barriers())
    return false;

  // Each barrier alone in its block: [phis] ... | barrier | after ...
  std::vector<CallInst *> marks;
  for (BasicBlock &bb : *body)
    for (Instruction &i : bb)
      if (auto *ci = dyn_cast<CallInst>(&i); ci && ci->getCalledFunction() == marker)
        marks.push_back(ci);
  for (CallInst *mk : marks) {
    BasicBlock *bb = mk->getParent()->splitBasicBlock(mk->getIterator(), "barrier");
    bb->splitBasicBlock(std::next(mk->getIterator()), "after.barrier");
    barrier_index[bb] = barrier_block.size();
    barrier_block.push_back(bb);
  }
  return true;
}

bool RegionBuilder::find_regions() {
  size_t n = barrier_block.size();
  if (n > MAX_REGIONS)
    return false;
  regions.resize(n);
  size_t cloned = 0;
  for (size_t r = 0; r < n; ++r) {
    regions[r].root = r == 0 ? &body->getEntryBlock()
                             : barrier_block[r]->getTerminator()->getSuccessor(0);
    build_region(regions[r], barrier_index);
    for (BasicBlock *bb : regions[r].rpo)
      cloned += bb->size();
  }
  return cloned <= MAX_CLONED_INSTRUCTIONS;
}

// Which uses cannot see their value in their region's copy, and the frame layout.
bool RegionBuilder::find_frame() {
  std::set<Instruction *> crossing;
  std::vector<Instruction *> crossing_order;
  std::set<Value *> is_alloca(allocas.begin(), allocas.end());
  auto need = [&](Value *v) -> Instruction * {
    auto *d = dyn_cast<Instruction>(v);
    if (!d || is_alloca.count(d))
      return nullptr;
    return d;
  };
  auto note = [&](unsigned r, Instruction *user, unsigned op, Instruction *d) {
    unsigned budget = 32;
    bool remat = rematerializable(d, budget);
    frame_uses.push_back({r, user, op, remat, false});
    if (!remat && crossing.insert(d).second)
      crossing_order.push_back(d);
  };
  for (unsigned r = 0; r < regions.size(); ++r) {
    const Region &g = regions[r];
    for (BasicBlock *x : g.rpo)
      for (Instruction &i : *x) {
        if (auto *phi = dyn_cast<PHINode>(&i)) {
          for (unsigned o = 0; o < phi->getNumIncomingValues(); ++o) {
            Instruction *d = need(phi->getIncomingValue(o));
            if (!d)
              continue;
            BasicBlock *p = phi->getIncomingBlock(o);
            if (g.in.count(p)) {
              if (!(g.in.count(d->getParent()) && region_dominates(g, d->getParent(), p)))
                note(r, phi, o, d);
            } else if (x == g.root && r > 0 && p == barrier_block[r]) {
              note(r, phi, o, d);
            }
          }
          continue;
        }
        for (unsigned o = 0; o < i.getNumOperands(); ++o) {
          Instruction *d = need(i.getOperand(o));
          if (!d)
            continue;
          BasicBlock *dp = d->getParent();
          bool seen = g.in.count(dp) &&
                      (dp == x ? d->comesBefore(&i) : region_dominates(g, dp, x));
          if (!seen)
            note(r, &i, o, d);
        }
      }
  }
  // Uniform crossing values every work item holds the same copy of after each pass: not
  // divergent, and made on the way to every barrier a region can leave by (so every work item
  // made it in its last pass; work items all take the same exit, or the block goes solo or
  // fails). A use in region r reads the copy from the pass's start when the value cannot have
  // been made again in this pass before the use.
  for (Instruction *d : crossing_order) {
    if (divergent.count(d))
      continue;
    BasicBlock *db = d->getParent();
    bool ok = true;
    for (const Region &g : regions) {
      if (!g.in.count(db))
        continue;
      for (BasicBlock *bb : g.rpo)
        for (BasicBlock *s : successors(bb))
          if (barrier_index.count(s) && !region_dominates(g, db, bb))
            ok = false;
    }
    if (ok)
      uniform_ok.insert(d);
  }
  for (FrameUse &u : frame_uses) {
    if (u.remat)
      continue;
    auto *d = cast<Instruction>(isa<PHINode>(u.user)
                                    ? cast<PHINode>(u.user)->getIncomingValue(u.op)
                                    : u.user->getOperand(u.op));
    if (!uniform_ok.count(d))
      continue;
    const Region &g = regions[u.region];
    BasicBlock *at = isa<PHINode>(u.user) ? cast<PHINode>(u.user)->getIncomingBlock(u.op)
                                          : u.user->getParent();
    // Blocks of this region reachable from the value's block, past it.
    bool again = false;
    if (g.in.count(d->getParent())) {
      std::set<BasicBlock *> seen;
      std::vector<BasicBlock *> work;
      for (BasicBlock *s : successors(d->getParent()))
        if (g.in.count(s))
          work.push_back(s);
      while (!work.empty() && !again) {
        BasicBlock *b = work.back();
        work.pop_back();
        if (!seen.insert(b).second)
          continue;
        again = b == at;
        for (BasicBlock *s : successors(b))
          if (g.in.count(s))
            work.push_back(s);
      }
      // In the value's own block, a use after it sees this pass's value.
      if (at == d->getParent() && !isa<PHINode>(u.user) && d->comesBefore(u.user))
        again = true;
    }
    u.uniform = !again;
  }
  const DataLayout &dl = m.getDataLayout();
  for (AllocaInst *a : allocas) {
    std::optional<TypeSize> size = a->getAllocationSize(dl);
    if (!size || size->isScalable())
      return false;
    uint64_t align = a->getAlign().value();
    frame.push_back({a, alignTo(size->getFixedValue(), align), align});
  }
  for (Instruction *d : crossing_order) {
    Type *t = d->getType();
    if (t->isTokenTy() || t->isVoidTy() || !t->isSized())
      return false;
    TypeSize size = dl.getTypeAllocSize(t);
    if (size.isScalable())
      return false;
    uint64_t align = dl.getABITypeAlign(t).value();
    frame.push_back({d, alignTo(size.getFixedValue(), align), align});
  }
  if (implicit)
    frame.push_back({nullptr, 4, 4}); // each work item's next region
  std::stable_sort(frame.begin(), frame.end(),
                   [](const FrameEntry &a, const FrameEntry &b) { return a.align > b.align; });
  for (size_t e = 0; e < frame.size(); ++e) {
    if (frame[e].align > MAX_FRAME_ALIGN)
      return false;
    frame[e].offset = frame_bytes;
    frame_bytes += frame[e].size;
    if (frame[e].value)
      frame_index[frame[e].value] = e;
    else
      next_entry = e;
  }
  return true;
}

// The frame slot of `v` for work item `item`.
Value *RegionBuilder::slot(IRBuilder<> &b, Instruction *v, Value *item) {
  const FrameEntry &e = frame[frame_index.at(v)];
  return b.CreateInBoundsGEP(b.getInt8Ty(), e.base, b.CreateMul(item, b.getInt64(e.size)));
}

bool RegionBuilder::build() {
  const DataLayout &dl = m.getDataLayout();
  StructType *ctx_type = h.ctx_type;
  Type *i32 = Type::getInt32Ty(c);
  Type *i64 = Type::getInt64Ty(c);
  wg = declare_work_group(m, k);
  Argument *args = wg->getArg(0);
  Argument *block = wg->getArg(1);
  Argument *begin = wg->getArg(2);
  Argument *end = wg->getArg(3);
  Argument *frame_arg = wg->getArg(4);

  BasicBlock *entry = BasicBlock::Create(c, "entry", wg);
  BasicBlock *bbody = BasicBlock::Create(c, "wg.block", wg);
  BasicBlock *dispatch = BasicBlock::Create(c, "wg.region", wg);
  BasicBlock *blatch = BasicBlock::Create(c, "wg.block.next", wg);
  BasicBlock *exit = BasicBlock::Create(c, "wg.done", wg);
  BasicBlock *diverged = BasicBlock::Create(c, "wg.diverged", wg);

  IRBuilder<> b(entry);
  LaunchShape shape = read_launch_shape(b, ctx_type, dl, block);
  AllocaInst *local = shape.local;
  Value *bx = shape.bx, *by = shape.by, *bz = shape.bz;
  // The bitwise or and and of the work items' next regions: they agree iff the two are equal
  // (or/and reductions, which the vectoriser always recognises; instcombine turns a min with a
  // constant into something it does not).
  AllocaInst *lowest = b.CreateAlloca(i32, nullptr, "next.and");
  AllocaInst *highest = b.CreateAlloca(i32, nullptr, "next.or");
  // The pass-start copy of each uniform crossing value (promoted to registers by SROA).
  std::map<Instruction *, AllocaInst *> uniform_copy;
  for (Instruction *d : uniform_ok)
    uniform_copy[d] = b.CreateAlloca(d->getType(), nullptr, d->getName() + ".uniform");
  Value *bx64 = b.CreateZExt(bx, i64);
  Value *by64 = b.CreateZExt(by, i64);
  Value *bxy64 = b.CreateMul(bx64, by64, "bxy", true, true);
  Value *items = b.CreateMul(bxy64, b.CreateZExt(bz, i64), "items", true, true);
  std::vector<Value *> values = unpack_arguments(b, k, args);
  for (FrameEntry &e : frame)
    e.base = b.CreateInBoundsGEP(b.getInt8Ty(), frame_arg,
                                 b.CreateMul(items, b.getInt64(e.offset)), "frame");
  b.CreateBr(bbody);

  b.SetInsertPoint(bbody);
  PHINode *bl = b.CreatePHI(i64, 2, "block");
  bl->addIncoming(begin, entry);
  set_block_id(b, ctx_type, shape, bl);
  b.CreateBr(dispatch);

  b.SetInsertPoint(dispatch);
  PHINode *state = b.CreatePHI(i32, 1 + regions.size(), "region");
  state->addIncoming(b.getInt32(0), bbody);
  SwitchInst *sw = b.CreateSwitch(state, blatch, regions.size());

  b.SetInsertPoint(blatch);
  Value *bl1 = b.CreateAdd(bl, b.getInt64(1), "block.next", true, true);
  b.CreateCondBr(b.CreateICmpULT(bl1, end), bbody, exit);
  bl->addIncoming(bl1, blatch);
  b.SetInsertPoint(exit);
  b.CreateRet(b.getInt64(0));
  b.SetInsertPoint(diverged);
  b.CreateRet(b.CreateAdd(bl, b.getInt64(1)));

  std::set<Instruction *> crossing;
  for (const FrameEntry &e : frame)
    if (e.value && !isa<AllocaInst>(e.value))
      crossing.insert(e.value);
  auto next_slot = [&](IRBuilder<> &at, Value *item) {
    const FrameEntry &e = frame[next_entry];
    return at.CreateInBoundsGEP(at.getInt8Ty(), e.base, at.CreateMul(item, at.getInt64(4)));
  };

  // A copy of region r's blocks for the work item `item`, entered from `head` (which ends in
  // no terminator yet: this adds the branch to the region). `solo`: the copy runs one work
  // item on its own (every crossing value from its own frame slot). `exit_to(target)` is the
  // block a region exit to `target` (a region, or DONE) goes to. Returns the copies, or an
  // empty list if something of the body would be left in the work-group function.
  auto copy_region = [&](unsigned r, BasicBlock *head, Value *item, bool solo,
                         const std::function<BasicBlock *(unsigned)> &exit_to,
                         const std::string &tag) {
    const Region &g = regions[r];
    IRBuilder<> hb(head);
    ValueToValueMapTy vm;
    for (unsigned i = 0; i < k->arg_size(); ++i)
      vm[body->getArg(i)] = values[i];
    vm[body->getArg(k->arg_size())] = local;
    std::map<BasicBlock *, BasicBlock *> copy;
    std::vector<BasicBlock *> copies;
    for (BasicBlock *bb : g.rpo) {
      BasicBlock *cb = CloneBasicBlock(bb, vm, "." + tag, wg);
      copy[bb] = cb;
      copies.push_back(cb);
      vm[bb] = cb;
    }
    // K's stack variables: this work item's part of the frame.
    for (AllocaInst *a : allocas) {
      if (auto it = vm.find(a); it != vm.end())
        cast<Instruction>(it->second)->eraseFromParent();
      vm[a] = slot(hb, a, item);
    }
    Instruction *into = hb.CreateBr(copy.at(g.root));

    // Uses that read the frame, or a value computed again, or the pass-start copy.
    std::map<Value *, Value *> recomputed;
    IRBuilder<> again(into);
    for (const FrameUse &u : frame_uses) {
      if (u.region != r)
        continue;
      auto *uc = cast<Instruction>(vm[u.user]);
      Instruction *d = cast<Instruction>(
          isa<PHINode>(u.user) ? cast<PHINode>(u.user)->getIncomingValue(u.op)
                               : u.user->getOperand(u.op));
      IRBuilder<> at(c);
      auto *phi = dyn_cast<PHINode>(uc);
      if (phi) {
        BasicBlock *p = phi->getIncomingBlock(u.op);
        at.SetInsertPoint(g.in.count(p) ? copy.at(p)->getTerminator() : into);
      } else {
        at.SetInsertPoint(uc);
      }
      Value *v;
      if (u.remat)
        v = rematerialize(again, d, vm, recomputed);
      else if (u.uniform && !solo)
        v = at.CreateLoad(d->getType(), uniform_copy.at(d));
      else
        v = at.CreateLoad(d->getType(), slot(at, d, item));
      if (phi)
        phi->setIncomingValue(u.op, v);
      else
        uc->setOperand(u.op, v);
    }
    // Phis: edges from outside the region go; the edge from the region's barrier comes from
    // the head.
    for (BasicBlock *bb : g.rpo)
      for (PHINode &phi : copy.at(bb)->phis())
        for (unsigned o = phi.getNumIncomingValues(); o-- > 0;) {
          BasicBlock *p = phi.getIncomingBlock(o);
          if (g.in.count(p))
            continue;
          if (bb == g.root && r > 0 && p == barrier_block[r])
            phi.setIncomingBlock(o, head);
          else
            phi.removeIncomingValue(o, false);
        }
    // Exits: a barrier (the region after it comes next) or a return.
    for (BasicBlock *bb : g.rpo) {
      Instruction *t = copy.at(bb)->getTerminator();
      if (isa<ReturnInst>(t)) {
        BranchInst::Create(exit_to(DONE), t->getIterator());
        t->eraseFromParent();
        continue;
      }
      for (unsigned s = 0; s < t->getNumSuccessors(); ++s)
        if (auto it = barrier_index.find(t->getSuccessor(s)); it != barrier_index.end())
          t->setSuccessor(s, exit_to(it->second));
    }
    for (BasicBlock *cb : copies)
      for (Instruction &i : *cb)
        RemapInstruction(&i, vm, RF_IgnoreMissingLocals | RF_NoModuleLevelChanges);
    // Values later passes read: stored to the frame where they are made.
    for (BasicBlock *bb : g.rpo)
      for (Instruction &i : *bb) {
        if (!crossing.count(&i))
          continue;
        auto *ic = cast<Instruction>(vm[&i]);
        IRBuilder<> at(c);
        if (isa<PHINode>(ic))
          at.SetInsertPoint(ic->getParent(), ic->getParent()->getFirstInsertionPt());
        else
          at.SetInsertPoint(ic->getNextNode());
        at.CreateStore(ic, slot(at, &i, item));
      }
    // Nothing of the body may be left.
    for (BasicBlock *cb : copies)
      for (Instruction &i : *cb)
        for (Value *op : i.operands()) {
          bool foreign = false;
          if (auto *oi = dyn_cast<Instruction>(op))
            foreign = oi->getFunction() != wg;
          else if (auto *ob = dyn_cast<BasicBlock>(op))
            foreign = ob->getParent() != wg;
          else if (auto *oa = dyn_cast<Argument>(op))
            foreign = oa->getParent() != wg;
          if (foreign)
            return std::vector<BasicBlock *>{};
        }
    return copies;
  };

  // Solo (implicit barriers only): the work items of a block that parted ways at an implicit
  // barrier each run on alone from where they stopped, to their end.
  BasicBlock *solo = nullptr;
  if (implicit) {
    solo = BasicBlock::Create(c, "solo", wg);
    BasicBlock *sitem = BasicBlock::Create(c, "solo.item", wg);
    BasicBlock *sdispatch = BasicBlock::Create(c, "solo.region", wg);
    BasicBlock *snext = BasicBlock::Create(c, "solo.item.next", wg);
    b.SetInsertPoint(solo);
    b.CreateBr(sitem);
    b.SetInsertPoint(sitem);
    PHINode *i = b.CreatePHI(i64, 2, "solo.i");
    i->addIncoming(b.getInt64(0), solo);
    b.CreateStore(b.CreateTrunc(b.CreateURem(i, bx64), i32), field(b, ctx_type, local, 0, 0));
    b.CreateStore(b.CreateTrunc(b.CreateURem(b.CreateUDiv(i, bx64), by64), i32),
                  field(b, ctx_type, local, 0, 1));
    b.CreateStore(b.CreateTrunc(b.CreateUDiv(i, bxy64), i32), field(b, ctx_type, local, 0, 2));
    Value *first = b.CreateLoad(i32, next_slot(b, i));
    b.CreateBr(sdispatch);
    b.SetInsertPoint(sdispatch);
    PHINode *sr = b.CreatePHI(i32, 2, "solo.r");
    sr->addIncoming(first, sitem);
    SwitchInst *ssw = b.CreateSwitch(sr, snext, regions.size());
    b.SetInsertPoint(snext);
    Value *i1 = b.CreateAdd(i, b.getInt64(1), "", true, true);
    b.CreateCondBr(b.CreateICmpULT(i1, items), sitem, blatch);
    i->addIncoming(i1, snext);
    for (unsigned r = 0; r < regions.size(); ++r) {
      std::string tag = "solo" + std::to_string(r);
      BasicBlock *head = BasicBlock::Create(c, tag, wg);
      ssw->addCase(b.getInt32(r), head);
      std::map<unsigned, BasicBlock *> exits;
      auto exit_to = [&](unsigned target) {
        auto [it, fresh] = exits.insert({target, nullptr});
        if (fresh) {
          it->second = BasicBlock::Create(c, tag + ".exit", wg);
          BranchInst::Create(sdispatch, it->second);
          sr->addIncoming(ConstantInt::get(i32, target), it->second);
        }
        return it->second;
      };
      if (copy_region(r, head, i, true, exit_to, tag).empty())
        return false;
    }
  }

  for (unsigned r = 0; r < regions.size(); ++r) {
    std::string tag = "r" + std::to_string(r);
    BasicBlock *start = BasicBlock::Create(c, tag + ".start", wg);
    BasicBlock *zbody = BasicBlock::Create(c, tag + ".z", wg);
    BasicBlock *ybody = BasicBlock::Create(c, tag + ".y", wg);
    BasicBlock *xbody = BasicBlock::Create(c, tag + ".x", wg);
    BasicBlock *latch = BasicBlock::Create(c, tag + ".x.next", wg);
    BasicBlock *ylatch = BasicBlock::Create(c, tag + ".y.next", wg);
    BasicBlock *zlatch = BasicBlock::Create(c, tag + ".z.next", wg);
    BasicBlock *done = BasicBlock::Create(c, tag + ".done", wg);
    BasicBlock *agreed = BasicBlock::Create(c, tag + ".agreed", wg);
    sw->addCase(b.getInt32(r), start);

    b.SetInsertPoint(start);
    b.CreateStore(b.getInt32(DONE), lowest);
    b.CreateStore(b.getInt32(0), highest);
    static_assert(DONE == 0xffffffffu, "the and of no work item is all ones");
    b.CreateBr(zbody);
    auto [x, y, z] = open_item_loops(b, ctx_type, local, start, zbody, ybody, xbody);
    Value *row = b.CreateAdd(b.CreateMul(b.CreateZExt(z, i64), by64), b.CreateZExt(y, i64));
    Value *item = b.CreateAdd(b.CreateMul(row, bx64), b.CreateZExt(x, i64), "item");

    b.SetInsertPoint(latch);
    PHINode *next = b.CreatePHI(i32, 2, "next");
    std::map<unsigned, BasicBlock *> exits;
    auto exit_to = [&](unsigned target) {
      auto [it, fresh] = exits.insert({target, nullptr});
      if (fresh) {
        it->second = BasicBlock::Create(
            c, tag + (target == DONE ? ".return" : ".to.r" + std::to_string(target)), wg);
        BranchInst::Create(latch, it->second);
        next->addIncoming(ConstantInt::get(i32, target), it->second);
      }
      return it->second;
    };
    std::vector<BasicBlock *> copies = copy_region(r, xbody, item, false, exit_to, tag);
    if (copies.empty())
      return false;

    // The latch: this work item's next region folded into the block's and and or
    // (and kept per work item when the block may go solo).
    b.SetInsertPoint(latch);
    if (next->getNumIncomingValues() == 0) {
      // The region never ends (every path is unreachable): nothing continues.
      next->eraseFromParent();
      b.CreateUnreachable();
    } else {
      if (implicit)
        b.CreateStore(next, next_slot(b, item));
      Value *lo = b.CreateAnd(b.CreateLoad(i32, lowest), next);
      Value *hi = b.CreateOr(b.CreateLoad(i32, highest), next);
      b.CreateStore(lo, lowest);
      b.CreateStore(hi, highest);
      Value *x1 = b.CreateAdd(x, b.getInt32(1), "x.next", true, true);
      BranchInst *back = b.CreateCondBr(b.CreateICmpULT(x1, bx), xbody, ylatch);
      x->addIncoming(x1, latch);
      std::vector<BasicBlock *> loop_body{xbody};
      loop_body.insert(loop_body.end(), copies.begin(), copies.end());
      for (auto &[target, bb] : exits)
        loop_body.push_back(bb);
      mark_parallel(c, loop_body, back);
    }
    b.SetInsertPoint(ylatch);
    Value *y1 = b.CreateAdd(y, b.getInt32(1), "y.next", true, true);
    b.CreateCondBr(b.CreateICmpULT(y1, by), ybody, zlatch);
    y->addIncoming(y1, ylatch);
    b.SetInsertPoint(zlatch);
    Value *z1 = b.CreateAdd(z, b.getInt32(1), "z.next", true, true);
    b.CreateCondBr(b.CreateICmpULT(z1, bz), zbody, done);
    z->addIncoming(z1, zlatch);
    b.SetInsertPoint(done);
    Value *lo = b.CreateLoad(i32, lowest);
    Value *hi = b.CreateLoad(i32, highest);
    b.CreateCondBr(b.CreateICmpEQ(lo, hi), agreed, implicit ? solo : diverged);
    // All agree: the pass-start copies of the uniform values for the next pass (work item
    // 0's, the same as everyone's).
    b.SetInsertPoint(agreed);
    for (auto &[d, copy] : uniform_copy) {
      const FrameEntry &e = frame[frame_index.at(d)];
      b.CreateStore(b.CreateLoad(d->getType(), e.base), copy);
    }
    b.CreateBr(dispatch);
    state->addIncoming(lo, agreed);
  }
  // Blocks of regions no work item can leave (an unreachable latch) are dropped by the
  // optimiser; the function must verify now.
  return !verifyFunction(*wg, nullptr);
}

bool RegionBuilder::run() {
  if (!make_body() || !find_regions() || !find_frame())
    return false;
  if (implicit) {
    // Interleaving pays when little lives across an iteration: otherwise the plain loop.
    size_t per_item = 0;
    for (const FrameEntry &e : frame)
      per_item += e.value && !isa<AllocaInst>(e.value) && !uniform_ok.count(e.value);
    if (per_item > MAX_IMPLICIT_CROSSING || !allocas.empty())
      return false;
  }
  if (!build()) {
    if (wg)
      wg->eraseFromParent();
    return false;
  }
  auto *bytes = ConstantInt::get(Type::getInt64Ty(c), frame_bytes);
  auto *g = new GlobalVariable(m, bytes->getType(), true, GlobalValue::ExternalLinkage, bytes,
                               ("__offload_wgf_" + k->getName()).str());
  g->setVisibility(GlobalValue::DefaultVisibility);
  return true;
}

} // namespace

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
    bool ok = barrier_users.count(k) ? RegionBuilder(h, k).run()
                                     : RegionBuilder(h, k).run() || make_plain_work_group(h, k);
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
