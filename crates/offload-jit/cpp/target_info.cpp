// What the JIT engine needs from LLVM that its C API does not offer:
// - the processor and feature tables of a target (to check a CPU name and feature list before
//   code generation: LLVM would otherwise continue with a generic processor, or ignore an
//   unknown feature, after a warning on stderr);
// - a target machine with the options llc uses (static constructors in .init_array, which the
//   dynamic loader runs, rather than .ctors, which it ignores);
// - parsing IR or bitcode with the target's data layout when the module has none, as llc does
//   (the C API parses with LLVM's default layout and leaves alignments computed from it).
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/Module.h"
#include "llvm/IRReader/IRReader.h"
#include "llvm/MC/MCSubtargetInfo.h"
#include "llvm/MC/TargetRegistry.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Target/TargetMachine.h"
#include "llvm/Target/TargetOptions.h"
#include "llvm-c/Core.h"
#include "llvm-c/TargetMachine.h"

#include <cstddef>
#include <cstring>
#include <optional>
#include <string>

using Sink = void (*)(void *, const char *, size_t);

extern "C" int offload_jit_cpu_is_valid(void *target_machine, const char *cpu) {
  auto *tm = reinterpret_cast<llvm::TargetMachine *>(target_machine);
  const llvm::MCSubtargetInfo *sti = tm->getMCSubtargetInfo();
  return sti && sti->isCPUStringValid(cpu) ? 1 : 0;
}

extern "C" void offload_jit_cpu_names(void *target_machine, Sink sink, void *ctx) {
  auto *tm = reinterpret_cast<llvm::TargetMachine *>(target_machine);
  const llvm::MCSubtargetInfo *sti = tm->getMCSubtargetInfo();
  if (!sti)
    return;
  for (const auto &desc : sti->getAllProcessorDescriptions()) {
    llvm::StringRef key(desc.Key);
    sink(ctx, key.data(), key.size());
  }
}

extern "C" void offload_jit_feature_names(void *target_machine, Sink sink, void *ctx) {
  auto *tm = reinterpret_cast<llvm::TargetMachine *>(target_machine);
  const llvm::MCSubtargetInfo *sti = tm->getMCSubtargetInfo();
  if (!sti)
    return;
  for (const auto &feature : sti->getAllProcessorFeatures()) {
    llvm::StringRef key(feature.Key);
    sink(ctx, key.data(), key.size());
  }
}

// reloc: 0 = the target's default, 1 = PIC. opt: 0..3.
extern "C" LLVMTargetMachineRef offload_jit_create_target_machine(LLVMTargetRef target, const char *triple,
                                                                  const char *cpu, const char *features,
                                                                  int opt, int reloc) {
  llvm::TargetOptions options;
  options.UseInitArray = true;
  std::optional<llvm::Reloc::Model> rm;
  if (reloc == 1)
    rm = llvm::Reloc::PIC_;
  llvm::CodeGenOptLevel level = opt <= 0   ? llvm::CodeGenOptLevel::None
                                : opt == 1 ? llvm::CodeGenOptLevel::Less
                                : opt == 2 ? llvm::CodeGenOptLevel::Default
                                           : llvm::CodeGenOptLevel::Aggressive;
  auto *t = reinterpret_cast<llvm::Target *>(target);
  llvm::TargetMachine *tm =
      t->createTargetMachine(triple, cpu, features, options, rm, std::nullopt, level, false);
  return reinterpret_cast<LLVMTargetMachineRef>(tm);
}

// Parses bitcode or textual IR. A module without a data layout gets `default_layout` before
// anything is computed from it. On failure returns null and writes a malloc'ed message.
extern "C" LLVMModuleRef offload_jit_parse_module(LLVMContextRef context, const char *data, size_t len,
                                                  const char *name, const char *default_layout,
                                                  char **error) {
  std::unique_ptr<llvm::MemoryBuffer> buffer =
      llvm::MemoryBuffer::getMemBufferCopy(llvm::StringRef(data, len), name);
  std::string layout(default_layout);
  auto set_layout = [&](llvm::StringRef, llvm::StringRef current) -> std::optional<std::string> {
    if (!current.empty())
      return std::nullopt;
    return layout;
  };
  llvm::SMDiagnostic diagnostic;
  std::unique_ptr<llvm::Module> module =
      llvm::parseIR(buffer->getMemBufferRef(), diagnostic, *llvm::unwrap(context),
                    llvm::ParserCallbacks(set_layout));
  if (!module) {
    std::string text;
    llvm::raw_string_ostream os(text);
    if (diagnostic.getLineNo() > 0)
      os << "line " << diagnostic.getLineNo() << ":" << (diagnostic.getColumnNo() + 1) << ": ";
    os << diagnostic.getMessage();
    os.flush();
    *error = strdup(text.c_str());
    return nullptr;
  }
  return llvm::wrap(module.release());
}
