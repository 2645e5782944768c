// The two questions about a target machine that LLVM's C API cannot answer: is this CPU name
// one the target knows, and which names does it know. Asking before code generation matters:
// an unknown CPU makes LLVM fall back to a generic processor with only a warning on stderr, or,
// for some GPU targets, produce code for the wrong chip.
#include "llvm/MC/MCSubtargetInfo.h"
#include "llvm/Target/TargetMachine.h"

#include <cstddef>

extern "C" int offload_jit_cpu_is_valid(void *target_machine, const char *cpu) {
  auto *tm = reinterpret_cast<llvm::TargetMachine *>(target_machine);
  const llvm::MCSubtargetInfo *sti = tm->getMCSubtargetInfo();
  return sti && sti->isCPUStringValid(cpu) ? 1 : 0;
}

extern "C" void offload_jit_cpu_names(void *target_machine,
                                      void (*sink)(void *, const char *, size_t),
                                      void *ctx) {
  auto *tm = reinterpret_cast<llvm::TargetMachine *>(target_machine);
  const llvm::MCSubtargetInfo *sti = tm->getMCSubtargetInfo();
  if (!sti)
    return;
  for (const auto &desc : sti->getAllProcessorDescriptions()) {
    llvm::StringRef key(desc.Key);
    sink(ctx, key.data(), key.size());
  }
}
