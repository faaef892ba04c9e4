// The bf16 GEMM forced onto oneDNN's matmul (EMBER_BF16_GEMM=onednn): its AMX kernels on CPUs
// with AMX, its AVX512-BF16 ones otherwise, with small products and odd inner dimensions on
// the fallback. Every check of gemm_bf16_cases.h runs on it.
#define GEMM_BF16_SUITE GemmBf16OneDnn
#include "gemm_bf16_cases.h"

namespace {
const bool path_forced = gemm_bf16_cases::force_path(ember::cpu::Bf16GemmPath::OneDnn);
}  // namespace

TEST(GemmBf16OneDnn, PathIsForcedToOneDnn) {
  ASSERT_TRUE(path_forced);
  EXPECT_EQ(ember::cpu::bf16_gemm_path(), ember::cpu::Bf16GemmPath::OneDnn);
}
