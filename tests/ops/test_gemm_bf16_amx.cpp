// The bf16 GEMM forced onto Ember's own AMX kernel (EMBER_BF16_GEMM=amx; skipped on CPUs without
// AMX-BF16, or where Linux refuses the tile state). Every check of gemm_bf16_cases.h runs on the
// real tile instructions, plus the BERT training shapes at full size and a comparison with the
// emulated tiles that test_gemm_bf16_amx_emulated checks on any CPU.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#define GEMM_BF16_SUITE GemmBf16Amx
#include "gemm_bf16_cases.h"
#include "kernels/cpu/gemm_bf16_amx.h"

namespace {
const bool path_forced = gemm_bf16_cases::force_path(ember::cpu::Bf16GemmPath::Amx);
}  // namespace

TEST(GemmBf16Amx, PathIsForcedToAmx) {
  ASSERT_TRUE(path_forced);
  EXPECT_EQ(ember::cpu::bf16_gemm_path(), ember::cpu::Bf16GemmPath::Amx);
  EXPECT_TRUE(ember::cpu::amx_tiles_usable());
  EXPECT_EQ(ember::cpu::amx_tiles_unusable_reason(), "");
}

// bench_matmul's BERT rows, at their real sizes (hidden 256, FFN 1024), through cpu::gemm on
// two threads: forward x W^T, input gradient dY W, weight gradient dY^T X.
TEST(GemmBf16Amx, BertTrainingShapesMatchReference) {
  using namespace gemm_bf16_cases;
  ThreadCount tc(2);
  struct Case {
    bool trans_a, trans_b;
    int64_t m, n, k;
  };
  for (const Case& c : {Case{false, true, 512, 1024, 256}, Case{false, false, 512, 256, 1024},
                        Case{true, false, 256, 1024, 512}})
    for (DType out : {DType::bf16, DType::f32}) {
      GemmCase g;
      g.trans_a = c.trans_a;
      g.trans_b = c.trans_b;
      g.m = c.m;
      g.n = c.n;
      g.k = c.k;
      g.out = out;
      g.beta = out == DType::f32 ? 1.0f : 0.0f;
      EXPECT_TRUE(gemm_matches_reference(g)) << g.describe();
    }
}

// The instructions against their emulation on the same packed tiles: both sum the same exact
// products in f32, so they agree to within the rounding of a k-term sum (bit for bit if the
// hardware adds in the order the emulation does).
TEST(GemmBf16Amx, HardwareAgreesWithEmulatedTiles) {
  using namespace ember;
  for (int layout = 0; layout < 4; ++layout)
    for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{70, 45, 600}, {33, 17, 31}, {64, 64, 64}}) {
      const bool ta = layout & 1, tb = layout & 2;
      const int64_t lda = ta ? m : k, ldb = tb ? k : n;
      const Tensor a = ember::testing::random_tensor(ta ? Shape{k, m} : Shape{m, k}, DType::bf16);
      const Tensor b = ember::testing::random_tensor(tb ? Shape{n, k} : Shape{k, n}, DType::bf16);
      const std::vector<float> c0 = ember::testing::random_tensor({m, n}, DType::f32).to_vector<float>();
      std::vector<float> hw = c0, emulated = c0;
      cpu::gemm_bf16_amx_serial(ta, tb, m, n, k, 1.5f, a.data_ptr<BFloat16>(), lda, b.data_ptr<BFloat16>(), ldb, 0.5f,
                                hw.data(), n);
      cpu::gemm_bf16_amx_emulated_serial(ta, tb, m, n, k, 1.5f, a.data_ptr<BFloat16>(), lda, b.data_ptr<BFloat16>(),
                                         ldb, 0.5f, emulated.data(), n);
      const std::vector<float> av = a.to_vector<float>(), bv = b.to_vector<float>();
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double scale = 0.5 * std::abs(double(c0[size_t(i * n + j)]));
          for (int64_t kk = 0; kk < k; ++kk)
            scale += 1.5 * std::abs(double(av[size_t(ta ? kk * lda + i : i * lda + kk)]) *
                                    double(bv[size_t(tb ? j * ldb + kk : kk * ldb + j)]));
          const size_t at = size_t(i * n + j);
          ASSERT_LE(std::abs(double(hw[at]) - double(emulated[at])), 2.4e-7 * double(k + 2) * scale)
              << "C[" << i << "][" << j << "] of " << m << " x " << n << " x " << k << ", layout " << layout;
        }
    }
}
