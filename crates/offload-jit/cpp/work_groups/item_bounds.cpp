// Guards on the work-item ID turned into the bounds of the work-item loop (see item_bounds.h).
//
// A kernel starts with `if (i < n)` (or `if (x >= X || y >= Y) return;`, ...), where i is the
// block's base plus the thread ID. In the loop nest over a block's work items the guard is a
// branch in the loop body, and the vectoriser makes of it a loop of masked loads and stores
// across the whole block: 7x slower than the native loop on saxpy (861 against 117.5 us on one
// core, measured with clang-19 -O3 -march=znver3). Here the loop runs only over the thread IDs
// that pass the guards, with the guards gone from its body: no masks, the native loop.
//
// What is recognised: in the body's prefix (the blocks every work item runs before anything
// with an effect), branches whose other side leads, doing nothing, to the loop's latch (the
// work item ends). The condition to go on is split into a conjunction of atoms (through and,
// or, select and not), and each atom `A pred N` whose one side is linear in the thread ID t
// (A = C + t modulo 2^w, C the same for the whole loop, through add, sub, trunc, zext and
// sext) and whose other side is loop-invariant gives an interval of t: unsigned and signed
// <, <=, >, >= and ==. Atoms invariant in the loop (a row guard `y < H` in the x loop) empty
// the interval when false. Other atoms stay in the body. Loop-invariant values computed in the
// body (the block's base, a bound loaded from memory) are computed again before the loop.
//
// Where C + t could wrap over the block (more than 2^31 or 2^32 work items along x) the
// interval is not an interval; a run-time check then takes the original loop, left scalar.
#include "item_bounds.h"

#include "llvm/Analysis/ValueTracking.h"
#include "llvm/IR/Constants.h"
#include "llvm/IR/Dominators.h"
#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/Instructions.h"
#include "llvm/IR/IntrinsicInst.h"
#include "llvm/IR/Module.h"
#include "llvm/IR/PatternMatch.h"
#include "llvm/Transforms/Utils/Cloning.h"
#include "llvm/Transforms/Utils/ValueMapper.h"

#include <map>
#include <optional>
#include <set>
#include <vector>

using namespace llvm;

namespace {

// Byte offsets of the thread-ID fields of the host context (offload_kernel.h).
constexpr int64_t THREAD_ID_X = 0, THREAD_ID_Y = 4, THREAD_ID_Z = 8, THREAD_ID_END = 12;

// An instruction a work item may skip without anyone seeing: no effect on memory, the
// context stores of the loop nest itself, and markers.
bool skippable(const Instruction &i, const Value *local) {
  if (auto *s = dyn_cast<StoreInst>(&i))
    return !s->isVolatile() && getUnderlyingObject(s->getPointerOperand()) == local;
  if (auto *ii = dyn_cast<IntrinsicInst>(&i)) {
    switch (ii->getIntrinsicID()) {
    case Intrinsic::lifetime_start:
    case Intrinsic::lifetime_end:
    case Intrinsic::assume:
    case Intrinsic::experimental_noalias_scope_decl:
    case Intrinsic::dbg_declare:
    case Intrinsic::dbg_value:
    case Intrinsic::dbg_label:
      return true;
    default:
      break;
    }
  }
  if (i.isTerminator() || isa<PHINode>(i))
    return true;
  return !i.mayHaveSideEffects();
}

// One conjunct of the condition for a work item to go on: `cmp` must be `want`.
struct Atom {
  ICmpInst *cmp;
  bool want;
};

struct Linear {
  Value *c;  // the loop-invariant part, computed before the loop
  bool unit; // whether t is added (else the value is invariant)
};

class Bounder {
public:
  Bounder(const ItemLoop &l)
      : l(l), c(l.xbody->getContext()), dl(l.xbody->getModule()->getDataLayout()),
        pre(l.preheader->getTerminator()) {}

  bool run();

private:
  const ItemLoop &l;
  LLVMContext &c;
  const DataLayout &dl;
  IRBuilder<> pre; // before the preheader's branch into the loop
  std::set<BasicBlock *> loop;
  std::set<BasicBlock *> prefix;
  // The prefix blocks up to the first guard: every work item runs them, so what they read or
  // divide by may be done once before the loop (later blocks: only what may be speculated).
  std::set<BasicBlock *> always;
  std::map<Value *, Value *> hoisted;
  std::vector<Value *> no_wrap; // conditions under which every interval is exact

  bool nothing_to(BasicBlock *bb) const;
  std::optional<int64_t> context_field(Value *ptr) const;
  Value *hoist(Value *v);
  std::optional<Linear> linear(Value *v);
  void atoms(Value *cond, bool want, std::vector<Atom> &out);
  Value *exact(Value *cw, Value *bw, bool is_signed, unsigned w);
};

// Whether control from `bb` reaches the latch through blocks that do nothing (the work item
// ends).
bool Bounder::nothing_to(BasicBlock *bb) const {
  for (unsigned steps = 0; steps < 16; ++steps) {
    if (!loop.count(bb) || bb == l.xbody)
      return false;
    for (Instruction &i : *bb)
      if (isa<PHINode>(i) || !skippable(i, l.local))
        return false;
    if (bb == l.latch->getParent())
      return true;
    auto *br = dyn_cast<BranchInst>(bb->getTerminator());
    if (!br || br->isConditional())
      return false;
    bb = br->getSuccessor(0);
  }
  return false;
}

// The byte offset into the local context that `ptr` addresses, if it does.
std::optional<int64_t> Bounder::context_field(Value *ptr) const {
  APInt offset(dl.getIndexTypeSizeInBits(ptr->getType()), 0);
  const Value *base = ptr->stripAndAccumulateConstantOffsets(dl, offset, true);
  if (base != l.local)
    return std::nullopt;
  return offset.getSExtValue();
}

// `v` as a value available before the loop (computed again there if it is computed in the
// prefix), or null if it varies in the loop or cannot be moved.
Value *Bounder::hoist(Value *v) {
  if (auto it = hoisted.find(v); it != hoisted.end())
    return it->second;
  auto *i = dyn_cast<Instruction>(v);
  if (!i || !loop.count(i->getParent()))
    return v; // an argument, a constant or a value of the blocks around the loop
  Value *result = nullptr;
  if (prefix.count(i->getParent()) && !isa<PHINode>(i) && !i->isTerminator() &&
      skippable(*i, l.local) && (!isa<CallBase>(i) || isa<IntrinsicInst>(i)) &&
      (always.count(i->getParent()) || isSafeToSpeculativelyExecute(i))) {
    if (auto *load = dyn_cast<LoadInst>(i); load && !load->isSimple()) {
      // volatile or atomic: stays where it is
    } else if (load) {
      std::optional<int64_t> f = context_field(load->getPointerOperand());
      if (f && *f >= THREAD_ID_X && *f < THREAD_ID_END) {
        // The thread IDs: y and z are the outer loops' counters, x is not invariant.
        if (*f == THREAD_ID_Y && load->getType() == l.y->getType())
          result = l.y;
        else if (*f == THREAD_ID_Z && load->getType() == l.z->getType())
          result = l.z;
      } else if (f || !may_access_stack(*load)) {
        // The rest of the context is set before the loops; other memory read in the prefix
        // by every work item is not written by another in the same block (a data race on a
        // GPU too), so one read before the loop gives the value each would read.
        if (Value *p = hoist(load->getPointerOperand())) {
          LoadInst *copy = pre.CreateAlignedLoad(load->getType(), p, load->getAlign());
          result = copy;
        }
      }
    } else if (!i->mayReadFromMemory()) {
      std::vector<Value *> ops;
      for (Value *op : i->operands()) {
        Value *h = hoist(op);
        if (!h) {
          ops.clear();
          break;
        }
        ops.push_back(h);
      }
      if (ops.size() == i->getNumOperands()) {
        Instruction *copy = i->clone();
        for (unsigned n = 0; n < ops.size(); ++n)
          copy->setOperand(n, ops[n]);
        // Flags that made it poison where the original never used it.
        copy->dropPoisonGeneratingFlags();
        copy->dropPoisonGeneratingMetadata();
        copy->setMetadata(LLVMContext::MD_access_group, nullptr);
        pre.Insert(copy);
        result = copy;
      }
    }
  }
  hoisted[v] = result;
  return result;
}

// `v` as C + t (modulo 2^w) or as C, with C available before the loop.
std::optional<Linear> Bounder::linear(Value *v) {
  if (!v->getType()->isIntegerTy())
    return std::nullopt;
  if (v == l.x)
    return Linear{ConstantInt::get(v->getType(), 0), true};
  if (auto *load = dyn_cast<LoadInst>(v))
    if (std::optional<int64_t> f = context_field(load->getPointerOperand());
        f && *f == THREAD_ID_X && load->isSimple() && load->getType() == l.x->getType() &&
        prefix.count(load->getParent()))
      return Linear{ConstantInt::get(v->getType(), 0), true};
  if (Value *h = hoist(v))
    return Linear{h, false};
  auto *i = dyn_cast<Instruction>(v);
  if (!i || !prefix.count(i->getParent()))
    return std::nullopt;
  switch (i->getOpcode()) {
  case Instruction::Add:
  case Instruction::Sub: {
    std::optional<Linear> a = linear(i->getOperand(0)), b = linear(i->getOperand(1));
    if (!a || !b || (a->unit && b->unit) || (i->getOpcode() == Instruction::Sub && b->unit))
      return std::nullopt;
    Value *sum = i->getOpcode() == Instruction::Add ? pre.CreateAdd(a->c, b->c)
                                                    : pre.CreateSub(a->c, b->c);
    return Linear{sum, a->unit || b->unit};
  }
  case Instruction::Trunc: {
    // Exact modulo 2^w.
    std::optional<Linear> a = linear(i->getOperand(0));
    if (!a)
      return std::nullopt;
    return Linear{pre.CreateTrunc(a->c, v->getType()), a->unit};
  }
  case Instruction::ZExt:
  case Instruction::SExt: {
    // ext(C + t) = ext(C) + t when C + t does not wrap over the block.
    std::optional<Linear> a = linear(i->getOperand(0));
    if (!a)
      return std::nullopt;
    bool is_signed = i->getOpcode() == Instruction::SExt;
    unsigned w = a->c->getType()->getIntegerBitWidth();
    if (a->unit) {
      Type *wide = IntegerType::get(c, 2 * std::max(w, 32u));
      Value *cw = is_signed ? pre.CreateSExt(a->c, wide) : pre.CreateZExt(a->c, wide);
      no_wrap.push_back(exact(cw, pre.CreateZExt(l.bx, wide), is_signed, w));
    }
    Value *e = is_signed ? pre.CreateSExt(a->c, v->getType()) : pre.CreateZExt(a->c, v->getType());
    return Linear{e, a->unit};
  }
  default:
    return std::nullopt;
  }
}

// Whether C + t, for every t of the block, is C + t without wrapping around in w bits (`cw`
// and `bw`, the block's size, in a type twice as wide).
Value *Bounder::exact(Value *cw, Value *bw, bool is_signed, unsigned w) {
  Type *wide = cw->getType();
  APInt limit = is_signed ? APInt::getOneBitSet(wide->getIntegerBitWidth(), w - 1)
                          : APInt::getOneBitSet(wide->getIntegerBitWidth(), w);
  return pre.CreateICmpSLE(pre.CreateAdd(cw, bw), ConstantInt::get(wide, limit));
}

// The conjuncts of `cond == want`.
void Bounder::atoms(Value *cond, bool want, std::vector<Atom> &out) {
  using namespace PatternMatch;
  Value *a, *b;
  if (want ? match(cond, m_LogicalAnd(m_Value(a), m_Value(b)))
           : match(cond, m_LogicalOr(m_Value(a), m_Value(b)))) {
    atoms(a, want, out);
    atoms(b, want, out);
  } else if (match(cond, m_Not(m_Value(a)))) {
    atoms(a, !want, out);
  } else if (auto *cmp = dyn_cast<ICmpInst>(cond);
             cmp && cmp->getOperand(0)->getType()->isIntegerTy()) {
    out.push_back({cmp, want});
  } // anything else stays in the loop's body
}

bool Bounder::run() {
  Function *f = l.xbody->getParent();
  // The loop: every block from which the latch is reached without leaving through the
  // preheader or the exit.
  {
    std::vector<BasicBlock *> work{l.latch->getParent()};
    loop.insert(l.xbody);
    while (!work.empty()) {
      BasicBlock *bb = work.back();
      work.pop_back();
      if (!loop.insert(bb).second)
        continue;
      for (BasicBlock *p : predecessors(bb))
        work.push_back(p);
    }
  }
  if (loop.count(l.preheader) || loop.count(l.exit))
    return false;

  // The prefix and its guards.
  struct Guard {
    BranchInst *br;
    bool go_on; // the branch's value to go on
  };
  std::vector<Guard> guards;
  BasicBlock *bb = l.xbody;
  for (unsigned steps = 0; steps < 64; ++steps) {
    bool clean = true;
    for (Instruction &i : *bb)
      if (!skippable(i, l.local)) {
        clean = false;
        break;
      }
    if (!clean)
      break;
    prefix.insert(bb);
    if (guards.empty())
      always.insert(bb);
    auto *br = dyn_cast<BranchInst>(bb->getTerminator());
    if (!br || br == l.latch)
      break;
    BasicBlock *next;
    if (br->isUnconditional()) {
      next = br->getSuccessor(0);
    } else if (nothing_to(br->getSuccessor(1))) {
      guards.push_back({br, true});
      next = br->getSuccessor(0);
    } else if (nothing_to(br->getSuccessor(0))) {
      guards.push_back({br, false});
      next = br->getSuccessor(1);
    } else {
      break;
    }
    if (!loop.count(next) || next == l.xbody || !next->getSinglePredecessor())
      break;
    bb = next;
  }
  if (guards.empty())
    return false;

  // The interval [lo, hi) of t that passes every recognised atom, in a type twice as wide as
  // the widest compared value.
  std::vector<Atom> all;
  for (const Guard &g : guards)
    atoms(g.br->getCondition(), g.go_on, all);
  unsigned widest = 32;
  for (const Atom &a : all)
    widest = std::max(widest, a.cmp->getOperand(0)->getType()->getIntegerBitWidth());
  if (widest > 64)
    return false;
  Type *wide = IntegerType::get(c, 2 * widest);
  Value *bw = pre.CreateZExt(l.bx, wide);
  Value *lo = ConstantInt::get(wide, 0), *hi = bw;
  Value *active = ConstantInt::getTrue(c);
  std::vector<Atom> used;
  bool any_interval = false;
  for (const Atom &a : all) {
    CmpInst::Predicate p = a.want ? a.cmp->getPredicate() : a.cmp->getInversePredicate();
    std::optional<Linear> lhs = linear(a.cmp->getOperand(0));
    std::optional<Linear> rhs = lhs ? linear(a.cmp->getOperand(1)) : std::nullopt;
    if (!lhs || !rhs)
      continue;
    if (!lhs->unit && !rhs->unit) {
      // Invariant in the loop: all or none of the work items go on.
      Value *v = hoist(a.cmp);
      if (!v)
        continue;
      active = pre.CreateAnd(active, a.want ? v : pre.CreateNot(v));
      used.push_back(a);
      continue;
    }
    if (lhs->unit && rhs->unit)
      continue;
    if (rhs->unit) {
      std::swap(lhs, rhs);
      p = CmpInst::getSwappedPredicate(p);
    }
    if (p == CmpInst::ICMP_NE)
      continue;
    bool is_signed = CmpInst::isSigned(p);
    unsigned w = lhs->c->getType()->getIntegerBitWidth();
    Value *cw = is_signed ? pre.CreateSExt(lhs->c, wide) : pre.CreateZExt(lhs->c, wide);
    Value *nw = is_signed ? pre.CreateSExt(rhs->c, wide) : pre.CreateZExt(rhs->c, wide);
    no_wrap.push_back(exact(cw, bw, is_signed, w));
    // C + t pred N  <=>  t pred' N - C.
    Value *d = pre.CreateSub(nw, cw);
    Value *d1 = pre.CreateAdd(d, ConstantInt::get(wide, 1));
    auto lower = [&](Value *v) { lo = pre.CreateBinaryIntrinsic(Intrinsic::smax, lo, v); };
    auto upper = [&](Value *v) { hi = pre.CreateBinaryIntrinsic(Intrinsic::smin, hi, v); };
    switch (p) {
    case CmpInst::ICMP_ULT:
    case CmpInst::ICMP_SLT:
      upper(d);
      break;
    case CmpInst::ICMP_ULE:
    case CmpInst::ICMP_SLE:
      upper(d1);
      break;
    case CmpInst::ICMP_UGT:
    case CmpInst::ICMP_SGT:
      lower(d1);
      break;
    case CmpInst::ICMP_UGE:
    case CmpInst::ICMP_SGE:
      lower(d);
      break;
    case CmpInst::ICMP_EQ:
      lower(d);
      upper(d1);
      break;
    default:
      continue;
    }
    used.push_back(a);
    any_interval = true;
  }
  if (!any_interval)
    return false; // the loop unswitcher does as well for invariant guards

  Value *ok = ConstantInt::getTrue(c);
  for (Value *v : no_wrap)
    ok = pre.CreateAnd(ok, v);
  active = pre.CreateAnd(active, pre.CreateICmpSLT(lo, hi));
  Type *ti = l.x->getType();
  Value *lo_t = pre.CreateTrunc(lo, ti, "items.lo");
  Value *hi_t = pre.CreateTrunc(hi, ti, "items.hi");

  // The loop again, for [lo, hi) without the atoms: the original stays for the wrapping case.
  ValueToValueMapTy vm;
  SmallVector<BasicBlock *, 16> copies;
  for (BasicBlock *b : loop) {
    BasicBlock *copy = CloneBasicBlock(b, vm, ".bounded", f);
    vm[b] = copy;
    copies.push_back(copy);
  }
  remapInstructionsInBlocks(copies, vm);
  BasicBlock *enter = BasicBlock::Create(c, "items.bounded", f, cast<BasicBlock>(vm[l.xbody]));
  IRBuilder<>(enter).CreateCondBr(active, cast<BasicBlock>(vm[l.xbody]), l.exit);
  auto *x = cast<PHINode>(vm[l.x]);
  x->setIncomingBlock(x->getBasicBlockIndex(l.preheader), enter);
  x->setIncomingValue(x->getBasicBlockIndex(enter), lo_t);
  cast<ICmpInst>(vm[l.latch_cmp])->setOperand(1, hi_t);
  for (const Atom &a : used)
    if (auto it = vm.find(a.cmp); it != vm.end())
      it->second->replaceAllUsesWith(ConstantInt::getBool(c, a.want));
  // The original loop: only for launches of more than 2^31 work items along x. Scalar.
  MDNode *scalar = MDNode::get(c, {MDString::get(c, "llvm.loop.vectorize.enable"),
                                   ConstantAsMetadata::get(ConstantInt::getFalse(c))});
  MDNode *id = MDNode::getDistinct(c, {nullptr, scalar});
  id->replaceOperandWith(0, id);
  l.latch->setMetadata(LLVMContext::MD_loop, id);
  Instruction *into = l.preheader->getTerminator();
  IRBuilder<>(into).CreateCondBr(ok, enter, l.xbody);
  into->eraseFromParent();
  return true;
}

} // namespace

bool bound_item_loop(const ItemLoop &l) { return Bounder(l).run(); }
