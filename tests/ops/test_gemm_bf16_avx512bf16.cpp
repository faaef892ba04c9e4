// The bf16 GEMM forced onto Ember's own vdpbf16ps kernel (EMBER_BF16_GEMM=avx512bf16; skipped
// on CPUs without AVX512-BF16). Every check of gemm_bf16_cases.h runs on it, plus the
// kernel's own promises.
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#define GEMM_BF16_SUITE GemmBf16Avx512Bf16
#include "gemm_bf16_cases.h"
#include "kernels/cpu/gemm_bf16_avx512.h"

namespace {
const bool path_forced = gemm_bf16_cases::force_path(ember::cpu::Bf16GemmPath::Avx512Bf16);
}  // namespace

TEST(GemmBf16Avx512Bf16, PathIsForcedToAvx512Bf16) {
  ASSERT_TRUE(path_forced);
  EXPECT_EQ(ember::cpu::bf16_gemm_path(), ember::cpu::Bf16GemmPath::Avx512Bf16);
}

// Each entry is summed in the same order whatever band or tile it falls in, so the thread
// count changes no bit, for either band direction, every layout and both output types.
TEST(GemmBf16Avx512Bf16, ThreadCountChangesNoBit) {
  using namespace gemm_bf16_cases;
  for (auto [m, n] : {std::pair<int64_t, int64_t>{301, 97}, {45, 333}})
    for (int layout = 0; layout < 4; ++layout)
      for (DType out : {DType::bf16, DType::f32}) {
        const bool ta = layout & 1, tb = layout & 2;
        const int64_t k = 601;  // two chunks, the last one odd
        const Tensor a = ta ? random_tensor({k, m}, DType::bf16) : random_tensor({m, k}, DType::bf16);
        const Tensor b = tb ? random_tensor({n, k}, DType::bf16) : random_tensor({k, n}, DType::bf16);
        const Tensor c0 = random_tensor({m, n}, out);
        std::vector<Tensor> results;
        for (int threads : {1, 2}) {
          ThreadCount tc(threads);
          Tensor c = c0.clone();
          if (out == DType::f32)
            cpu::gemm(ta, tb, m, n, k, 1.5f, a.data_ptr<BFloat16>(), ta ? m : k, b.data_ptr<BFloat16>(), tb ? k : n,
                      0.5f, c.data_ptr<float>(), n);
          else
            cpu::gemm(ta, tb, m, n, k, 1.5f, a.data_ptr<BFloat16>(), ta ? m : k, b.data_ptr<BFloat16>(), tb ? k : n,
                      0.5f, c.data_ptr<BFloat16>(), n);
          results.push_back(c);
        }
        const size_t bytes = size_t(m * n) * (out == DType::f32 ? 4 : 2);
        EXPECT_EQ(std::memcmp(results[0].raw_data(), results[1].raw_data(), bytes), 0)
            << m << " x " << n << " x " << k << " layout " << layout << " " << out;
      }
}

// A bf16 C is rounded like BFloat16(float): to nearest even, from the exact f32 sum. Products
// of two powers of two are exact, so the f32 sum here is exact and the rounding alone decides.
TEST(GemmBf16Avx512Bf16, Bf16OutputRoundsToNearestEven) {
  using namespace ember;
  // 1 + 2^-8 is the tie between bf16 neighbours 1 and 1 + 2^-7: even rounds it down to 1;
  // 1 + 3 * 2^-8 ties between 1 + 2^-7 and 1 + 2^-6: even rounds it up.
  for (auto [extra_terms, want] : {std::pair<int, float>{1, 1.0f}, {3, 1.015625f}}) {
    std::vector<float> av(8, 0.0f), bv(8, 0.0f);
    av[0] = 1.0f;
    bv[0] = 1.0f;
    for (int t = 1; t <= extra_terms; ++t) {
      av[size_t(t)] = 0.0625f;  // 2^-4
      bv[size_t(t)] = 0.0625f;
    }
    const Tensor a = from_vector<float>(av, {1, 8}).to(DType::bf16), b = from_vector<float>(bv, {8, 1}).to(DType::bf16);
    Tensor c = from_vector<float>({0.0f}, {1, 1}).to(DType::bf16);
    cpu::gemm(false, false, 1, 1, 8, 1.0f, a.data_ptr<BFloat16>(), 8, b.data_ptr<BFloat16>(), 1, 0.0f,
              c.data_ptr<BFloat16>(), 1);
    EXPECT_EQ(c.to(DType::f32).item<float>(), want) << extra_terms << " terms of 2^-8";
  }
  // NaN stays NaN, infinities stay infinite.
  const Tensor a = from_vector<float>({std::nanf(""), 1.0f}, {2, 1}).to(DType::bf16);
  const Tensor b = from_vector<float>({1.0f, 1e38f}, {1, 2}).to(DType::bf16);
  Tensor c = from_vector<float>({0, 0, 0, 0}, {2, 2}).to(DType::bf16);
  cpu::gemm(false, false, 2, 2, 1, 1e10f, a.data_ptr<BFloat16>(), 1, b.data_ptr<BFloat16>(), 2, 0.0f,
            c.data_ptr<BFloat16>(), 2);
  const std::vector<float> got = c.to(DType::f32).to_vector<float>();
  EXPECT_TRUE(std::isnan(got[0]) && std::isnan(got[1]));
  EXPECT_EQ(got[2], float(BFloat16(1e10f)));
  EXPECT_TRUE(std::isinf(got[3]) && got[3] > 0);
}

TEST(GemmBf16Avx512Bf16, DotProductSpeedupIsMeasured) {
  const double speedup = ember::cpu::bf16_dot_product_speedup();
  EXPECT_TRUE(std::isfinite(speedup) && speedup > 0.05 && speedup < 20.0) << speedup;
  EXPECT_EQ(ember::cpu::bf16_dot_product_speedup(), speedup) << "measured once";
}
