// The two halves of LLVM's default<On> pipeline, and the module split between them, for
// compiling a large module on several threads (compile.rs, `split`).
//
// `default<On>` is the module simplification pipeline (inlining and the function
// simplifications, interleaved over the call graph) followed by the module optimisation
// pipeline (vectorisation, unrolling, late cleanup). The first needs the whole module (what is
// inlined where); the second, like code generation, works function by function. So a large
// module is simplified whole, split into parts (as LLVM's LTO splitCodeGen does: every global
// in one part, references across parts made external and hidden), and each part is optimised
// and compiled in a context of its own on its own thread.
//
// The pass builder is set up as LLVMRunPasses sets it up (default tuning options, the
// target's analyses), so that the halves together run what `default<On>` runs there.
#include "llvm/Analysis/CGSCCPassManager.h"
#include "llvm/Analysis/LoopAnalysisManager.h"
#include "llvm/Bitcode/BitcodeWriter.h"
#include "llvm/IR/Module.h"
#include "llvm/IR/PassManager.h"
#include "llvm/Passes/PassBuilder.h"
#include "llvm/Passes/StandardInstrumentations.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Target/TargetMachine.h"
#include "llvm/Transforms/IPO/Annotation2Metadata.h"
#include "llvm/Transforms/IPO/ForceFunctionAttrs.h"
#include "llvm/Transforms/Utils/SplitModule.h"
#include "llvm-c/Core.h"
#include "llvm-c/TargetMachine.h"

using namespace llvm;

namespace {

OptimizationLevel level(unsigned opt) {
  switch (opt) {
  case 0:
    return OptimizationLevel::O0;
  case 1:
    return OptimizationLevel::O1;
  case 2:
    return OptimizationLevel::O2;
  default:
    return OptimizationLevel::O3;
  }
}

// Runs the half of default<On> that `simplify` names on `m`.
void run_half(Module &m, TargetMachine *tm, unsigned opt, bool simplify) {
  PipelineTuningOptions pto;
  PassInstrumentationCallbacks pic;
  PassBuilder pb(tm, pto, std::nullopt, &pic);
  LoopAnalysisManager lam;
  FunctionAnalysisManager fam;
  CGSCCAnalysisManager cgam;
  ModuleAnalysisManager mam;
  pb.registerLoopAnalyses(lam);
  pb.registerFunctionAnalyses(fam);
  pb.registerCGSCCAnalyses(cgam);
  pb.registerModuleAnalyses(mam);
  pb.crossRegisterProxies(lam, fam, cgam, mam);
  StandardInstrumentations si(m.getContext(), false, false);
  si.registerCallbacks(pic, &mam);
  ModulePassManager mpm;
  OptimizationLevel l = level(opt);
  if (simplify) {
    // What buildPerModuleDefaultPipeline runs before the simplification pipeline.
    mpm.addPass(Annotation2MetadataPass());
    mpm.addPass(ForceFunctionAttrsPass());
    pb.invokePipelineStartEPCallbacks(mpm, l);
    mpm.addPass(pb.buildModuleSimplificationPipeline(l, ThinOrFullLTOPhase::None));
  } else {
    mpm.addPass(pb.buildModuleOptimizationPipeline(l, ThinOrFullLTOPhase::None));
  }
  mpm.run(m, mam);
}

} // namespace

// The simplification half of default<On>, on the whole module. O0 has no halves: callers do
// not split at O0.
extern "C" void offload_jit_simplify(LLVMModuleRef m, LLVMTargetMachineRef tm, unsigned opt) {
  run_half(*unwrap(m), reinterpret_cast<TargetMachine *>(tm), opt, true);
}

// The optimisation half of default<On>, on one part.
extern "C" void offload_jit_optimize_part(LLVMModuleRef m, LLVMTargetMachineRef tm,
                                          unsigned opt) {
  run_half(*unwrap(m), reinterpret_cast<TargetMachine *>(tm), opt, false);
}

// Splits `m` into at most `parts` modules and hands each, as bitcode, to `sink`. Returns how
// many it made. `m` is left as SplitModule leaves it (its symbols externalised): the caller
// drops it.
extern "C" unsigned offload_jit_split(LLVMModuleRef m, unsigned parts,
                                      void (*sink)(void *, const char *, size_t), void *ctx) {
  unsigned made = 0;
  SplitModule(*unwrap(m), parts, [&](std::unique_ptr<Module> part) {
    SmallVector<char, 0> bytes;
    raw_svector_ostream out(bytes);
    WriteBitcodeToFile(*part, out);
    sink(ctx, bytes.data(), bytes.size());
    ++made;
  });
  return made;
}
