// The region form's analysis: the body (K inlined, its barriers marked), its regions and their
// dominators, which values differ between work items, and the implicit barriers at uniform
// loops (regions.h).
#include "regions.h"

#include "llvm/Analysis/LoopInfo.h"
#include "llvm/Analysis/ValueTracking.h"
#include "llvm/IR/Dominators.h"
#include "llvm/Transforms/Utils/Cloning.h"
#include "llvm/Transforms/Utils/Local.h"

namespace offload_wg {

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
        if (isa<PHINode>(&i))
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

bool make_region_work_group(const Host &h, Function *k) { return RegionBuilder(h, k).run(); }

} // namespace offload_wg
