// The region form's frame: which values cross a barrier, which are computed again instead,
// which are the same for every work item, and where each lives per work item (regions.h).
#include "regions.h"

#include "llvm/Analysis/ValueTracking.h"

namespace offload_wg {

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

} // namespace offload_wg
