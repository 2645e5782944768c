// The region form's work-group function: per block, a loop nest per region over the work
// items, a dispatch on the region they all stopped before, and (implicit barriers) the solo
// path for work items that part ways (regions.h).
#include "regions.h"

#include "llvm/IR/Verifier.h"
#include "llvm/Transforms/Utils/Cloning.h"

namespace offload_wg {

bool RegionBuilder::build() {
  emit_skeleton();
  // Solo (implicit barriers only): the work items of a block that parted ways at an implicit
  // barrier each run on alone from where they stopped, to their end.
  BasicBlock *solo = nullptr;
  if (implicit && !emit_solo(solo))
    return false;
  for (unsigned r = 0; r < regions.size(); ++r)
    if (!emit_region_loop(r, solo))
      return false;
  // Blocks of regions no work item can leave (an unreachable latch) are dropped by the
  // optimiser; the function must verify now.
  return !verifyFunction(*wg, nullptr);
}

// The function, its arguments unpacked and its frame's arrays placed, the loop over the
// blocks begin..end and the dispatch on the region to run next (`em`).
void RegionBuilder::emit_skeleton() {
  const DataLayout &dl = m.getDataLayout();
  em.ctx_type = h.ctx_type;
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
  em.dispatch = BasicBlock::Create(c, "wg.region", wg);
  em.blatch = BasicBlock::Create(c, "wg.block.next", wg);
  BasicBlock *exit = BasicBlock::Create(c, "wg.done", wg);
  em.diverged = BasicBlock::Create(c, "wg.diverged", wg);

  IRBuilder<> b(entry);
  em.shape = read_launch_shape(b, em.ctx_type, dl, block);
  // The bitwise or and and of the work items' next regions: they agree iff the two are equal
  // (or/and reductions, which the vectoriser always recognises; instcombine turns a min with a
  // constant into something it does not).
  em.lowest = b.CreateAlloca(i32, nullptr, "next.and");
  em.highest = b.CreateAlloca(i32, nullptr, "next.or");
  // The pass-start copy of each uniform crossing value (promoted to registers by SROA).
  for (Instruction *d : uniform_ok)
    em.uniform_copy[d] = b.CreateAlloca(d->getType(), nullptr, d->getName() + ".uniform");
  em.bx64 = b.CreateZExt(em.shape.bx, i64);
  em.by64 = b.CreateZExt(em.shape.by, i64);
  em.bxy64 = b.CreateMul(em.bx64, em.by64, "bxy", true, true);
  em.items = b.CreateMul(em.bxy64, b.CreateZExt(em.shape.bz, i64), "items", true, true);
  em.values = unpack_arguments(b, k, args);
  for (FrameEntry &e : frame)
    e.base = b.CreateInBoundsGEP(b.getInt8Ty(), frame_arg,
                                 b.CreateMul(em.items, b.getInt64(e.offset)), "frame");
  b.CreateBr(bbody);

  b.SetInsertPoint(bbody);
  PHINode *bl = b.CreatePHI(i64, 2, "block");
  bl->addIncoming(begin, entry);
  set_block_id(b, em.ctx_type, em.shape, bl);
  b.CreateBr(em.dispatch);

  b.SetInsertPoint(em.dispatch);
  em.state = b.CreatePHI(i32, 1 + regions.size(), "region");
  em.state->addIncoming(b.getInt32(0), bbody);
  em.sw = b.CreateSwitch(em.state, em.blatch, regions.size());

  b.SetInsertPoint(em.blatch);
  Value *bl1 = b.CreateAdd(bl, b.getInt64(1), "block.next", true, true);
  b.CreateCondBr(b.CreateICmpULT(bl1, end), bbody, exit);
  bl->addIncoming(bl1, em.blatch);
  b.SetInsertPoint(exit);
  b.CreateRet(b.getInt64(0));
  b.SetInsertPoint(em.diverged);
  b.CreateRet(b.CreateAdd(bl, b.getInt64(1)));

  for (const FrameEntry &e : frame)
    if (e.value && !isa<AllocaInst>(e.value))
      em.crossing.insert(e.value);
}

// Where work item `item` keeps the number of its next region (implicit barriers).
Value *RegionBuilder::next_slot(IRBuilder<> &at, Value *item) {
  const FrameEntry &e = frame[next_entry];
  return at.CreateInBoundsGEP(at.getInt8Ty(), e.base, at.CreateMul(item, at.getInt64(4)));
}

// A copy of region r's blocks for the work item `item`, entered from `head` (which ends in no
// terminator yet: this adds the branch to the region). `solo`: the copy runs one work item on
// its own (every crossing value from its own frame slot). `exit_to(target)` is the block a
// region exit to `target` (a region, or DONE) goes to. Returns the copies, or an empty list if
// something of the body would be left in the work-group function.
std::vector<BasicBlock *>
RegionBuilder::copy_region(unsigned r, BasicBlock *head, Value *item, bool solo,
                           const std::function<BasicBlock *(unsigned)> &exit_to,
                           const std::string &tag) {
  const Region &g = regions[r];
  IRBuilder<> hb(head);
  ValueToValueMapTy vm;
  for (unsigned i = 0; i < k->arg_size(); ++i)
    vm[body->getArg(i)] = em.values[i];
  vm[body->getArg(k->arg_size())] = em.shape.local;
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
      v = at.CreateLoad(d->getType(), em.uniform_copy.at(d));
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
      if (!em.crossing.count(&i))
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
}

// The solo path: for each work item of the block, from the region it stopped before, its
// regions one after the other until it returns; then the next block.
bool RegionBuilder::emit_solo(BasicBlock *&solo) {
  Type *i32 = Type::getInt32Ty(c);
  Type *i64 = Type::getInt64Ty(c);
  IRBuilder<> b(c);
  solo = BasicBlock::Create(c, "solo", wg);
  BasicBlock *sitem = BasicBlock::Create(c, "solo.item", wg);
  BasicBlock *sdispatch = BasicBlock::Create(c, "solo.region", wg);
  BasicBlock *snext = BasicBlock::Create(c, "solo.item.next", wg);
  b.SetInsertPoint(solo);
  b.CreateBr(sitem);
  b.SetInsertPoint(sitem);
  PHINode *i = b.CreatePHI(i64, 2, "solo.i");
  i->addIncoming(b.getInt64(0), solo);
  Value *local = em.shape.local;
  b.CreateStore(b.CreateTrunc(b.CreateURem(i, em.bx64), i32), field(b, em.ctx_type, local, 0, 0));
  b.CreateStore(b.CreateTrunc(b.CreateURem(b.CreateUDiv(i, em.bx64), em.by64), i32),
                field(b, em.ctx_type, local, 0, 1));
  b.CreateStore(b.CreateTrunc(b.CreateUDiv(i, em.bxy64), i32), field(b, em.ctx_type, local, 0, 2));
  Value *first = b.CreateLoad(i32, next_slot(b, i));
  b.CreateBr(sdispatch);
  b.SetInsertPoint(sdispatch);
  PHINode *sr = b.CreatePHI(i32, 2, "solo.r");
  sr->addIncoming(first, sitem);
  SwitchInst *ssw = b.CreateSwitch(sr, snext, regions.size());
  b.SetInsertPoint(snext);
  Value *i1 = b.CreateAdd(i, b.getInt64(1), "", true, true);
  b.CreateCondBr(b.CreateICmpULT(i1, em.items), sitem, em.blatch);
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
  return true;
}

// Region r's loop nest over the block's work items, entered from the dispatch: each work item
// runs the region to its next barrier (or its end); then, if all stopped before the same
// region, the dispatch goes on with it, else the block diverged (or, implicit barriers, goes
// solo).
bool RegionBuilder::emit_region_loop(unsigned r, BasicBlock *solo) {
  Type *i32 = Type::getInt32Ty(c);
  Type *i64 = Type::getInt64Ty(c);
  IRBuilder<> b(c);
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
  em.sw->addCase(b.getInt32(r), start);

  b.SetInsertPoint(start);
  b.CreateStore(b.getInt32(DONE), em.lowest);
  b.CreateStore(b.getInt32(0), em.highest);
  static_assert(DONE == 0xffffffffu, "the and of no work item is all ones");
  b.CreateBr(zbody);
  auto [x, y, z] = open_item_loops(b, em.ctx_type, em.shape.local, start, zbody, ybody, xbody);
  Value *row = b.CreateAdd(b.CreateMul(b.CreateZExt(z, i64), em.by64), b.CreateZExt(y, i64));
  Value *item = b.CreateAdd(b.CreateMul(row, em.bx64), b.CreateZExt(x, i64), "item");

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
    Value *lo = b.CreateAnd(b.CreateLoad(i32, em.lowest), next);
    Value *hi = b.CreateOr(b.CreateLoad(i32, em.highest), next);
    b.CreateStore(lo, em.lowest);
    b.CreateStore(hi, em.highest);
    Value *x1 = b.CreateAdd(x, b.getInt32(1), "x.next", true, true);
    BranchInst *back = b.CreateCondBr(b.CreateICmpULT(x1, em.shape.bx), xbody, ylatch);
    x->addIncoming(x1, latch);
    std::vector<BasicBlock *> loop_body{xbody};
    loop_body.insert(loop_body.end(), copies.begin(), copies.end());
    for (auto &[target, bb] : exits)
      loop_body.push_back(bb);
    mark_parallel(c, loop_body, back);
  }
  b.SetInsertPoint(ylatch);
  Value *y1 = b.CreateAdd(y, b.getInt32(1), "y.next", true, true);
  b.CreateCondBr(b.CreateICmpULT(y1, em.shape.by), ybody, zlatch);
  y->addIncoming(y1, ylatch);
  b.SetInsertPoint(zlatch);
  Value *z1 = b.CreateAdd(z, b.getInt32(1), "z.next", true, true);
  b.CreateCondBr(b.CreateICmpULT(z1, em.shape.bz), zbody, done);
  z->addIncoming(z1, zlatch);
  b.SetInsertPoint(done);
  Value *lo = b.CreateLoad(i32, em.lowest);
  Value *hi = b.CreateLoad(i32, em.highest);
  b.CreateCondBr(b.CreateICmpEQ(lo, hi), agreed, implicit ? solo : em.diverged);
  // All agree: the pass-start copies of the uniform values for the next pass (work item
  // 0's, the same as everyone's).
  b.SetInsertPoint(agreed);
  for (auto &[d, copy] : em.uniform_copy) {
    const FrameEntry &e = frame[frame_index.at(d)];
    b.CreateStore(b.CreateLoad(d->getType(), e.base), copy);
  }
  b.CreateBr(em.dispatch);
  em.state->addIncoming(lo, agreed);
  return true;
}

} // namespace offload_wg
