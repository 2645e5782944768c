// The parts the work-group functions share (see work_groups.cpp for what they are): the
// calling convention's constants, the module's host-kernel globals, the helpers both forms use
// (inlining, the context calls, the loop nest over a block's work items), and the two forms.
#pragma once

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

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace offload_wg {

using namespace llvm;

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

bool supported_param(const Argument &a);
std::set<const Function *> context_users(Module &m, const std::vector<const GlobalValue *> &vars);
Function *declare_work_group(Module &m, Function *k);
std::vector<Value *> unpack_arguments(IRBuilder<> &b, Function *k, Value *args);
void inline_callees(Function *f);
std::vector<CallBase *> calls_through(Function *f, GlobalVariable *var);
void erase_dead_loads(Function *f, GlobalVariable *var);
void replace_context_calls(Function *f, GlobalVariable *ctx_var, Value *with);
bool still_reaches_context(Function *f, const Host &h, const std::set<const Function *> &users);
void mark_parallel(LLVMContext &c, const std::vector<BasicBlock *> &body, BranchInst *latch);
Value *field(IRBuilder<> &at, StructType *ctx_type, Value *base, unsigned f, unsigned d);

// The launch as a work-group function reads it in its entry block: a local copy of the context
// `block` (whose IDs the function sets), the block's size and the grid's x and y extents.
struct LaunchShape {
  AllocaInst *local;
  Value *bx, *by, *bz; // i32
  Value *gx, *gy, *gxy; // i64
};
LaunchShape read_launch_shape(IRBuilder<> &b, StructType *ctx_type, const DataLayout &dl,
                              Value *block);
void set_block_id(IRBuilder<> &b, StructType *ctx_type, const LaunchShape &s, Value *bl);

// The heads of the three loops over a block's work items (`open_item_loops`).
struct ItemLoops {
  PHINode *x, *y, *z;
};
ItemLoops open_item_loops(IRBuilder<> &b, StructType *ctx_type, Value *local, BasicBlock *from,
                          BasicBlock *zb, BasicBlock *yb, BasicBlock *xb);

// Kernels without barriers: one loop nest, the kernel inlined (plain.cpp).
bool make_plain_work_group(const Host &h, Function *k);
// Kernels with barriers, or loops that gain from implicit ones: regions (regions.cpp).
bool make_region_work_group(const Host &h, Function *k);

} // namespace offload_wg
