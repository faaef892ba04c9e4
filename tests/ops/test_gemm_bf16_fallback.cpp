// The bf16 GEMM with EMBER_CPU_CAPABILITY=avx2: no bf16 instructions, operands widened to f32.
// The capability is read once, so the variable is set by a static initializer, before main and
// before the first GEMM; the checks are the same as in test_gemm_bf16.
#include <cstdlib>

#define GEMM_BF16_SUITE GemmBf16Fallback
#include "gemm_bf16_cases.h"

namespace {
const bool capability_forced = [] { return setenv("EMBER_CPU_CAPABILITY", "avx2", 1) == 0; }();
}  // namespace

TEST(GemmBf16Fallback, CapabilityIsForcedToAvx2) {
  ASSERT_TRUE(capability_forced);
  EXPECT_EQ(ember::cpu_capability(), ember::CpuCapability::Avx2);
  EXPECT_EQ(ember::cpu::bf16_gemm_path(), ember::cpu::Bf16GemmPath::Widened);
}

// At AVX2 neither oneDNN's bf16 matmul nor Ember's AVX512-BF16 or AMX kernel may run.
TEST(GemmBf16Fallback, Avx512PathsCannotBeForcedAtAvx2) {
  using ember::cpu::Bf16GemmPath;
  for (Bf16GemmPath path : {Bf16GemmPath::OneDnn, Bf16GemmPath::Avx512Bf16, Bf16GemmPath::Amx}) {
    EXPECT_FALSE(ember::cpu::bf16_gemm_path_available(path)) << ember::cpu::bf16_gemm_path_name(path);
    EXPECT_EMBER_ERROR(ember::cpu::set_bf16_gemm_path(path), "set_bf16_gemm_path", "avx2", "cannot run",
                       ember::cpu::bf16_gemm_path_name(path));
  }
  ember::cpu::set_bf16_gemm_path(Bf16GemmPath::Widened);
  EXPECT_EQ(ember::cpu::bf16_gemm_path(), Bf16GemmPath::Widened);
  ember::cpu::set_bf16_gemm_path(std::nullopt);
}
