// The bf16 GEMM forced onto the widened path (EMBER_BF16_GEMM=widened) at the CPU's best
// capability: operands converted to f32 for the f32 GEMM. Every check of gemm_bf16_cases.h
// runs on it.
#define GEMM_BF16_SUITE GemmBf16Widened
#include "gemm_bf16_cases.h"

namespace {
const bool path_forced = gemm_bf16_cases::force_path(ember::cpu::Bf16GemmPath::Widened);
}  // namespace

TEST(GemmBf16Widened, PathIsForcedToWidened) {
  ASSERT_TRUE(path_forced);
  EXPECT_EQ(ember::cpu::bf16_gemm_path(), ember::cpu::Bf16GemmPath::Widened);
}
