// Work-group functions for the host (ARCHITECTURE.md decision 8), made before the module is
// optimised.
//
// For each kernel K (an exported void function whose parameters are i32, i64, float, double or
// pointers) this adds
//
//     void __offload_wg_K(const uint64_t *args, offload_host_context *ctx,
//                         uint64_t begin, uint64_t end)
//
// which runs every work item of the blocks begin..end (linear block indices, x fastest) of the
// launch described by `ctx` (its grid, block and shared-memory fields): a loop over the blocks
// around three nested loops over the work-item IDs, K inlined into the innermost, K's arguments
// unpacked from `args` (one 8-byte slot each, as the plugin packs them). The kernel header's host accessors read the IDs through
// `__offload_host_context()`; in the work-group function those calls are replaced by a local
// copy of the context whose thread IDs are the loop variables, so after SROA the IDs are loop
// counters, invariant reads leave the loop and the vectoriser sees a plain loop. The inner loop
// is marked parallel (work items of a block are independent between barriers; a data race
// between them is undefined on every GPU too) and vectorisable.
//
// A kernel is left to the per-work-item path (no work-group function) when, after inlining, it
// still reaches the context or the barrier other than through those calls: it calls
// offload_barrier() (its work items need fibers), calls an un-inlinable function that reads an
// ID, or calls through a pointer.
#include "llvm/IR/Constants.h"
#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/Instructions.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/MDBuilder.h"
#include "llvm/IR/Module.h"
#include "llvm/Transforms/Utils/Cloning.h"
#include "llvm-c/Core.h"

#include <set>
#include <string>
#include <vector>

using namespace llvm;

namespace {

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

bool make_work_group(Module &m, Function *k, GlobalVariable *ctx_var, GlobalVariable *barrier_var,
                     StructType *ctx_type) {
  LLVMContext &c = m.getContext();
  const DataLayout &dl = m.getDataLayout();
  Type *i32 = Type::getInt32Ty(c);
  Type *i64 = Type::getInt64Ty(c);
  Type *ptr = PointerType::get(c, 0);
  std::string name = ("__offload_wg_" + k->getName()).str();
  if (m.getFunction(name))
    return false;
  FunctionType *wg_type = FunctionType::get(Type::getVoidTy(c), {ptr, ptr, i64, i64}, false);
  Function *wg = Function::Create(wg_type, GlobalValue::ExternalLinkage, name, m);
  wg->setVisibility(GlobalValue::DefaultVisibility);
  for (const char *attr : {"target-cpu", "target-features", "tune-cpu"})
    if (k->hasFnAttribute(attr))
      wg->addFnAttr(k->getFnAttribute(attr));
  wg->addFnAttr(Attribute::NoUnwind);
  Argument *args = wg->getArg(0);
  Argument *block = wg->getArg(1);
  Argument *begin = wg->getArg(2);
  Argument *end = wg->getArg(3);
  args->addAttr(Attribute::NoAlias);
  block->addAttr(Attribute::NoAlias);

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
  AllocaInst *local = b.CreateAlloca(ctx_type, nullptr, "ctx");
  b.CreateMemCpy(local, Align(8), block, Align(8), dl.getTypeAllocSize(ctx_type));
  auto field = [&](IRBuilder<> &at, Value *base, unsigned f, unsigned d) {
    return at.CreateInBoundsGEP(ctx_type, base, {at.getInt32(0), at.getInt32(f), at.getInt32(d)});
  };
  Value *bx = b.CreateLoad(i32, field(b, block, 2, 0), "bx");
  Value *by = b.CreateLoad(i32, field(b, block, 2, 1), "by");
  Value *bz = b.CreateLoad(i32, field(b, block, 2, 2), "bz");
  Value *gx = b.CreateZExt(b.CreateLoad(i32, field(b, block, 3, 0), "gx"), i64);
  Value *gy = b.CreateZExt(b.CreateLoad(i32, field(b, block, 3, 1), "gy"), i64);
  Value *gxy = b.CreateMul(gx, gy, "gxy", true, true);
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
  b.CreateBr(bbody);

  // The block: its linear index → its ID, in the local context.
  b.SetInsertPoint(bbody);
  PHINode *bl = b.CreatePHI(i64, 2, "block");
  bl->addIncoming(begin, entry);
  b.CreateStore(b.CreateTrunc(b.CreateURem(bl, gx), i32), field(b, local, 1, 0));
  b.CreateStore(b.CreateTrunc(b.CreateURem(b.CreateUDiv(bl, gx), gy), i32), field(b, local, 1, 1));
  b.CreateStore(b.CreateTrunc(b.CreateUDiv(bl, gxy), i32), field(b, local, 1, 2));
  b.CreateBr(zbody);

  b.SetInsertPoint(zbody);
  PHINode *z = b.CreatePHI(i32, 2, "z");
  z->addIncoming(b.getInt32(0), bbody);
  b.CreateBr(ybody);

  b.SetInsertPoint(ybody);
  PHINode *y = b.CreatePHI(i32, 2, "y");
  y->addIncoming(b.getInt32(0), zbody);
  b.CreateBr(xbody);

  b.SetInsertPoint(xbody);
  PHINode *x = b.CreatePHI(i32, 2, "x");
  x->addIncoming(b.getInt32(0), ybody);
  b.CreateStore(x, field(b, local, 0, 0));
  b.CreateStore(y, field(b, local, 0, 1));
  b.CreateStore(z, field(b, local, 0, 2));
  CallInst *call = b.CreateCall(k, values);
  call->setCallingConv(k->getCallingConv());
  Value *x1 = b.CreateAdd(x, b.getInt32(1), "x.next", true, true);
  BranchInst *xback = b.CreateCondBr(b.CreateICmpULT(x1, bx), xbody, ylatch);
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
  b.CreateRetVoid();

  // The kernel and, as far as possible, what it calls, inlined into the loop.
  {
    InlineFunctionInfo info;
    if (!InlineFunction(*call, info).isSuccess()) {
      wg->eraseFromParent();
      return false;
    }
  }
  for (int round = 0; round < 16; ++round) {
    std::vector<CallBase *> calls;
    for (BasicBlock &bb : *wg)
      for (Instruction &i : bb)
        if (auto *cb = dyn_cast<CallBase>(&i))
          if (Function *f = cb->getCalledFunction();
              f && !f->isDeclaration() && f != wg && f != k && !f->isIntrinsic())
            calls.push_back(cb);
    if (calls.empty())
      break;
    bool inlined = false;
    for (CallBase *cb : calls) {
      InlineFunctionInfo info;
      inlined |= InlineFunction(*cb, info).isSuccess();
    }
    if (!inlined)
      break;
  }

  // __offload_host_context() → the local context.
  std::vector<Instruction *> dead;
  for (BasicBlock &bb : *wg)
    for (Instruction &i : bb)
      if (auto *cb = dyn_cast<CallBase>(&i))
        if (auto *load = dyn_cast<LoadInst>(cb->getCalledOperand());
            load && load->getPointerOperand() == ctx_var) {
          cb->replaceAllUsesWith(local);
          dead.push_back(cb);
        }
  for (Instruction *i : dead)
    i->eraseFromParent();
  // The loads of the getter that fed those calls, now unused.
  dead.clear();
  for (BasicBlock &bb : *wg)
    for (Instruction &i : bb)
      if (auto *load = dyn_cast<LoadInst>(&i);
          load && load->getPointerOperand() == ctx_var && load->use_empty())
        dead.push_back(load);
  for (Instruction *i : dead)
    i->eraseFromParent();

  // Anything left that reaches the context or the barrier, or an indirect call: not eligible.
  std::vector<const GlobalValue *> vars{ctx_var};
  if (barrier_var)
    vars.push_back(barrier_var);
  std::set<const Function *> users = context_users(m, vars);
  for (BasicBlock &bb : *wg)
    for (Instruction &i : bb) {
      for (const Value *op : i.operands())
        if (op == ctx_var || (barrier_var && op == barrier_var)) {
          wg->eraseFromParent();
          return false;
        }
      if (auto *cb = dyn_cast<CallBase>(&i)) {
        const Function *f = cb->getCalledFunction();
        if (!f && !cb->isInlineAsm()) {
          wg->eraseFromParent();
          return false;
        }
        if (f && users.count(f)) {
          wg->eraseFromParent();
          return false;
        }
      }
    }

  // The inner loop: parallel (work items are independent between barriers) and vectorisable.
  MDNode *group = MDNode::getDistinct(c, {});
  std::set<BasicBlock *> outside{entry, bbody, zbody, ybody, ylatch, zlatch, blatch, exit};
  for (BasicBlock &bb : *wg)
    if (!outside.count(&bb))
      for (Instruction &i : bb)
        if (i.mayReadOrWriteMemory())
          i.setMetadata(LLVMContext::MD_access_group, group);
  MDNode *parallel = MDNode::get(c, {MDString::get(c, "llvm.loop.parallel_accesses"), group});
  MDNode *vectorize = MDNode::get(
      c, {MDString::get(c, "llvm.loop.vectorize.enable"), ConstantAsMetadata::get(b.getTrue())});
  // The back edge of the inner loop is now at the end of the inlined body (`xback` moved with
  // the split); find the branch that targets `xbody`.
  BranchInst *latch = nullptr;
  for (BasicBlock &bb : *wg)
    if (auto *br = dyn_cast<BranchInst>(bb.getTerminator()))
      for (BasicBlock *succ : br->successors())
        if (succ == xbody && &bb != ybody)
          latch = br;
  (void)xback;
  if (latch) {
    MDNode *loop = MDNode::getDistinct(c, {nullptr, parallel, vectorize});
    loop->replaceOperandWith(0, loop);
    latch->setMetadata(LLVMContext::MD_loop, loop);
  }
  return true;
}

} // namespace

// Adds the work-group functions; returns how many were made.
extern "C" int offload_jit_make_work_groups(LLVMModuleRef module_ref) {
  Module &m = *unwrap(module_ref);
  GlobalVariable *ctx_var = m.getNamedGlobal("__offload_host_context");
  if (!ctx_var)
    return 0;
  GlobalVariable *barrier_var = m.getNamedGlobal("__offload_host_barrier");
  LLVMContext &c = m.getContext();
  Type *i32 = Type::getInt32Ty(c);
  ArrayType *a3 = ArrayType::get(i32, 3);
  StructType *ctx_type =
      StructType::get(c, {a3, a3, a3, a3, PointerType::get(c, 0), i32, i32});
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
  int made = 0;
  for (Function *k : kernels)
    made += make_work_group(m, k, ctx_var, barrier_var, ctx_type) ? 1 : 0;
  return made;
}
