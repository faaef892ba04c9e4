// Which instruction-set level the CPU kernels may use, decided once at run time.
//
// The library is built for x86-64-v3 (AVX2, FMA, F16C); a few kernels also carry an AVX-512
// build and pick it when the processor has it. EMBER_CPU_CAPABILITY=avx2 forces the baseline
// (to test that path, or to compare); unknown values are an ember::Error.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace ember {

enum class CpuCapability { Avx2, Avx512 };

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512_bf16 = false;
  bool amx_bf16 = false;
};

// What the processor reports (cpuid, and enabled by the OS), regardless of any override.
const CpuFeatures& cpu_features();
// {"avx2", true}, {"avx512f", false}, ... in a fixed order, for printing.
std::vector<std::pair<std::string, bool>> cpu_feature_list();
// "model name" from /proc/cpuinfo, or "unknown".
std::string cpu_model_name();
// The level kernels dispatch on: the best the CPU has, capped by EMBER_CPU_CAPABILITY.
CpuCapability cpu_capability();
const char* cpu_capability_name(CpuCapability c);
// Overrides the level for this process (tests of the fallback path); cannot raise it above
// what the CPU supports.
void set_cpu_capability(CpuCapability c);
// oneDNN (the f32 GEMM) reads the level once, at the first GEMM; later changes do not reach it.

}  // namespace ember
