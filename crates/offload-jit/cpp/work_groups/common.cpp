// The helpers both forms of work-group function use (work_groups.h).
#include "work_groups.h"

#include "item_bounds.h"

#include "llvm/Analysis/CaptureTracking.h"
#include "llvm/Analysis/ValueTracking.h"
#include "llvm/Transforms/Utils/Cloning.h"

namespace offload_wg {

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

// The launch as a work-group function reads it in its entry block (work_groups.h).
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

} // namespace offload_wg

using namespace llvm;

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
