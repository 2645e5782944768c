// The host CPU's name and features exactly as LLVM's JIT targets them (llvm::sys::getHostCPUName
// and getHostCPUFeatures), without mapping libLLVM: this file is linked against LLVM's static
// TargetParser and Support archives, which pull in only the detection code.
#include "llvm/ADT/StringMap.h"
#include "llvm/TargetParser/Host.h"

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

using Sink = void (*)(void *, const char *, size_t);

extern "C" void offload_host_cpu_name(Sink sink, void *ctx) {
  llvm::StringRef name = llvm::sys::getHostCPUName();
  sink(ctx, name.data(), name.size());
}

// "+a,+b,-c,...", sorted by name so the string (part of JIT cache keys) is stable.
extern "C" void offload_host_cpu_features(Sink sink, void *ctx) {
  std::vector<std::string> features;
  for (const auto &entry : llvm::sys::getHostCPUFeatures())
    features.push_back(entry.first().str());
  std::sort(features.begin(), features.end());
  auto all = llvm::sys::getHostCPUFeatures();
  std::string out;
  for (const auto &f : features) {
    if (!out.empty())
      out += ',';
    out += all[f] ? '+' : '-';
    out += f;
  }
  sink(ctx, out.data(), out.size());
}
