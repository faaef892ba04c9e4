// The bf16 GEMM on the best path the CPU offers (oneDNN's AMX or AVX512-BF16 kernels where
// present), through cpu::gemm directly and through matmul, bmm and linear.
#include <cstdlib>

#include "gemm_bf16_cases.h"

TEST(GemmBf16, RunsAtTheCpusBestCapability) {
  if (std::getenv("EMBER_CPU_CAPABILITY") != nullptr) GTEST_SKIP() << "EMBER_CPU_CAPABILITY is set";
  const ember::CpuFeatures& f = ember::cpu_features();
  const bool avx512 = f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq;
  EXPECT_EQ(ember::cpu_capability(), avx512 ? ember::CpuCapability::Avx512 : ember::CpuCapability::Avx2);
}
