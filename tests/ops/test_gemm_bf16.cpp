// The bf16 GEMM on the automatic path (oneDNN's AMX kernels where present, see gemm_bf16.cpp
// for the rule), through cpu::gemm directly and through matmul, bmm and linear; and the
// path-selection interface.
#include <cstdlib>
#include <string>

#include "gemm_bf16_cases.h"
#include "kernels/cpu/gemm_bf16_amx.h"
#include "kernels/cpu/gemm_bf16_avx512.h"

TEST(GemmBf16, RunsAtTheCpusBestCapability) {
  if (std::getenv("EMBER_CPU_CAPABILITY") != nullptr) GTEST_SKIP() << "EMBER_CPU_CAPABILITY is set";
  const ember::CpuFeatures& f = ember::cpu_features();
  const bool avx512 = f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq;
  EXPECT_EQ(ember::cpu_capability(), avx512 ? ember::CpuCapability::Avx512 : ember::CpuCapability::Avx2);
}

// AMX: oneDNN (Ember's AMX kernel is never chosen automatically). AVX512-BF16 without AMX: Ember's kernel where vdpbf16ps outruns f32 FMAs,
// else widened. Anything less: widened.
TEST(GemmBf16, AutomaticPathFollowsTheMeasuredRule) {
  using namespace ember;
  using cpu::Bf16GemmPath;
  if (std::getenv("EMBER_BF16_GEMM") != nullptr) GTEST_SKIP() << "EMBER_BF16_GEMM is set";
  const CpuFeatures& f = cpu_features();
  Bf16GemmPath want = Bf16GemmPath::Widened;
  if (cpu_capability() == CpuCapability::Avx512) {
    if (f.amx_bf16)
      want = Bf16GemmPath::OneDnn;
    else if (f.avx512_bf16 && cpu::bf16_dot_product_speedup() >= 1.0)
      want = Bf16GemmPath::Avx512Bf16;
  }
  EXPECT_EQ(cpu::bf16_gemm_path_name(cpu::bf16_gemm_path()), std::string(cpu::bf16_gemm_path_name(want)));
}

// Where the tiles cannot run, the AMX kernel and the amx path say why instead of faulting.
TEST(GemmBf16, AmxKernelNamesWhyItCannotRun) {
  using namespace ember;
  if (cpu::amx_tiles_usable()) {
    EXPECT_EQ(cpu::amx_tiles_unusable_reason(), "");
    return;
  }
  const std::string why = cpu::amx_tiles_unusable_reason();
  EXPECT_NE(why, "");
  EXPECT_FALSE(cpu::bf16_gemm_path_available(cpu::Bf16GemmPath::Amx));
  const BFloat16 one(1.0f);
  float c = 0.0f;
  EXPECT_EMBER_ERROR(cpu::gemm_bf16_amx_serial(false, false, 1, 1, 1, 1.0f, &one, 1, &one, 1, 0.0f, &c, 1), "gemm",
                     "AMX", "m=1 n=1 k=1", why);
}

// set_bf16_gemm_path switches paths within a process and returns to the automatic choice.
TEST(GemmBf16, EveryAvailablePathCanBeSetAndMatchesReference) {
  using namespace gemm_bf16_cases;
  using cpu::Bf16GemmPath;
  if (std::getenv("EMBER_BF16_GEMM") != nullptr) GTEST_SKIP() << "EMBER_BF16_GEMM is set";
  const Bf16GemmPath automatic = cpu::bf16_gemm_path();
  int available = 0;
  for (Bf16GemmPath path :
       {Bf16GemmPath::OneDnn, Bf16GemmPath::Avx512Bf16, Bf16GemmPath::Widened, Bf16GemmPath::Amx}) {
    if (!cpu::bf16_gemm_path_available(path)) {
      EXPECT_EMBER_ERROR(cpu::set_bf16_gemm_path(path), "set_bf16_gemm_path", "cannot run",
                         cpu::bf16_gemm_path_name(path));
      continue;
    }
    ++available;
    cpu::set_bf16_gemm_path(path);
    EXPECT_EQ(cpu::bf16_gemm_path(), path);
    for (int trial = 0; trial < 20; ++trial) {
      GemmCase g = random_case(80, /*allow_zero=*/false);
      EXPECT_TRUE(gemm_matches_reference(g)) << cpu::bf16_gemm_path_name(path) << ", " << g.describe();
    }
  }
  cpu::set_bf16_gemm_path(std::nullopt);
  EXPECT_EQ(cpu::bf16_gemm_path(), automatic);
  EXPECT_GE(available, 1);
}
