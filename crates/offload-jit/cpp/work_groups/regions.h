// Kernels with barriers: the region form's types and its builder (regions.cpp: the regions and
// the divergence analysis; frame.cpp: the per-work-item frame; emit.cpp: the work-group
// function).
#pragma once

#include "work_groups.h"

#include "llvm/Transforms/Utils/ValueMapper.h"

namespace offload_wg {

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

bool region_dominates(const Region &r, BasicBlock *a, BasicBlock *b);
void build_region(Region &r, const std::map<BasicBlock *, unsigned> &barrier_index);

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
  void emit_skeleton();
  bool emit_solo(BasicBlock *&solo);
  bool emit_region_loop(unsigned r, BasicBlock *solo);
  std::vector<BasicBlock *> copy_region(unsigned r, BasicBlock *head, Value *item, bool solo,
                                        const std::function<BasicBlock *(unsigned)> &exit_to,
                                        const std::string &tag);
  Value *next_slot(IRBuilder<> &at, Value *item);
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

  // The work-group function under construction (emit.cpp): what its parts share.
  struct Emit {
    StructType *ctx_type = nullptr;
    LaunchShape shape{};
    Value *bx64 = nullptr, *by64 = nullptr, *bxy64 = nullptr; // the block's extents, i64
    Value *items = nullptr;                                    // work items per block, i64
    std::vector<Value *> values;                               // K's arguments, unpacked
    // The and and the or of the work items' next regions in a pass.
    AllocaInst *lowest = nullptr, *highest = nullptr;
    std::map<Instruction *, AllocaInst *> uniform_copy; // pass-start copies of uniform values
    std::set<Instruction *> crossing;                   // values kept in the frame
    BasicBlock *dispatch = nullptr; // the switch on the region all work items run next
    BasicBlock *blatch = nullptr;   // the next block
    BasicBlock *diverged = nullptr; // returns 1 + the block whose work items diverged
    PHINode *state = nullptr;       // the region to run next
    SwitchInst *sw = nullptr;
  } em;
};

} // namespace offload_wg
