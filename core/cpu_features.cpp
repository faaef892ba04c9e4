#include "core/cpu_features.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <string>

#include "core/error.h"

namespace ember {
namespace {

CpuFeatures detect() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512dq = __builtin_cpu_supports("avx512dq");
  f.avx512_bf16 = __builtin_cpu_supports("avx512bf16");
  // CPUID.(EAX=7, ECX=0):EDX bit 22. Read directly: clang 14's __builtin_cpu_supports does not
  // know "amx-bf16" (the fuzz and sanitizer builds use clang).
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  f.amx_bf16 = __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && ((edx >> 22) & 1u);
#endif
  return f;
}

CpuCapability best_supported() {
  const CpuFeatures& f = cpu_features();
  return (f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq) ? CpuCapability::Avx512 : CpuCapability::Avx2;
}

CpuCapability from_environment() {
  const CpuCapability best = best_supported();
  const char* env = std::getenv("EMBER_CPU_CAPABILITY");
  if (env == nullptr || *env == '\0') return best;
  const std::string v = env;
  if (v == "avx2") return CpuCapability::Avx2;
  if (v == "avx512") return best;  // never above what the CPU has
  EMBER_FAIL("EMBER_CPU_CAPABILITY: expected avx2 or avx512, got '", v, "'");
}

std::atomic<int>& current() {
  static std::atomic<int> level{static_cast<int>(from_environment())};
  return level;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

std::vector<std::pair<std::string, bool>> cpu_feature_list() {
  const CpuFeatures& f = cpu_features();
  return {{"avx2", f.avx2},         {"fma", f.fma},           {"avx512f", f.avx512f},
          {"avx512bw", f.avx512bw}, {"avx512vl", f.avx512vl}, {"avx512dq", f.avx512dq},
          {"avx512_bf16", f.avx512_bf16}, {"amx_bf16", f.amx_bf16}};
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) break;
    const auto start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? "unknown" : line.substr(start);
  }
  return "unknown";
}

CpuCapability cpu_capability() { return static_cast<CpuCapability>(current().load(std::memory_order_relaxed)); }

const char* cpu_capability_name(CpuCapability c) { return c == CpuCapability::Avx512 ? "avx512" : "avx2"; }

void set_cpu_capability(CpuCapability c) {
  const CpuCapability best = best_supported();
  current().store(static_cast<int>(c == CpuCapability::Avx512 ? best : c), std::memory_order_relaxed);
}

}  // namespace ember
