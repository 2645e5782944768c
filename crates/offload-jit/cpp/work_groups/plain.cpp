// Kernels without barriers: one loop nest over the work items, the kernel inlined into the
// innermost (work_groups.cpp has the overview).
#include "work_groups.h"

#include "item_bounds.h"

namespace offload_wg {

bool make_plain_work_group(const Host &h, Function *k) {
  Module &m = h.m;
  LLVMContext &c = m.getContext();
  const DataLayout &dl = m.getDataLayout();
  StructType *ctx_type = h.ctx_type;
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

} // namespace offload_wg
