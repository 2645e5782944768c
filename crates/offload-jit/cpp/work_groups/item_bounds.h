// The parts of the plain work-group functions (plain.cpp) that item_bounds.cpp shares.
#pragma once

#include "llvm/IR/BasicBlock.h"
#include "llvm/IR/Instructions.h"

// Whether `i` may access one of its function's stack variables (or a pointer into one).
bool may_access_stack(const llvm::Instruction &i);

// The innermost loop over a block's work items (x), as the plain loop nest builds it:
// `preheader` (the y loop's body) branches to `xbody`, which starts with the counter `x`
// (0, 1, ...); the kernel's body follows, ending at `latch`, the branch on `latch_cmp`
// (`x + 1 < bx`) back to `xbody` or on to `exit`. `local` is the work-group function's copy of
// the context, whose thread-ID fields the loops set from `x`, `y` and `z`.
struct ItemLoop {
  llvm::BasicBlock *preheader, *xbody, *exit;
  llvm::PHINode *x, *y, *z;
  llvm::BranchInst *latch;
  llvm::ICmpInst *latch_cmp;
  llvm::Value *bx;
  llvm::AllocaInst *local;
};

// Turns the guards at the start of the loop's body that end a work item (`if (i < n)`, `if (x
// >= X || y >= Y) return;`) into the loop's bounds, where it can show that this is exact, and
// keeps the original loop for the launches where it cannot. Returns whether it changed the
// loop. See item_bounds.cpp.
bool bound_item_loop(const ItemLoop &loop);
