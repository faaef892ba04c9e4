// The bf16 GEMM with EMBER_CPU_CAPABILITY=avx2: no bf16 instructions, operands widened to f32.
// The capability is read once, so the variable is set by a static initializer, before main and
// before the first GEMM; the checks are the same as in test_gemm_bf16.
#include <cstdlib>

#include "gemm_bf16_cases.h"

namespace {
const bool capability_forced = [] { return setenv("EMBER_CPU_CAPABILITY", "avx2", 1) == 0; }();
}  // namespace

TEST(GemmBf16, CapabilityIsForcedToAvx2) {
  ASSERT_TRUE(capability_forced);
  EXPECT_EQ(ember::cpu_capability(), ember::CpuCapability::Avx2);
}
