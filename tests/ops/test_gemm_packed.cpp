// Ember's packed GEMM (kernels/cpu/gemm_packed.h) against a double-precision naive product:
// all four layouts, odd sizes, strided operands and C, alpha and beta, NaN-filled C with
// beta == 0, k == 0, f32 and bf16 inputs, f32 and bf16 outputs, and the promise that every
// entry is summed in one order (bitwise equal results for 1 and 2 threads, and between the two
// micro-kernels), and the bias epilogue against seeding C with the bias (GemmBias.*, bit for
// bit). GemmPacked.* run the AVX2 kernel, which every supported CPU has;
// GemmPackedAvx512.* the AVX-512 one, skipped on CPUs without AVX-512F.
//
// Tolerances. Entry (i, j) is a k-term dot product accumulated in f32. With
//   scale = |alpha| (|A| |B|)_ij + |beta| |C0_ij|
// the f32 result is checked against the exact one as in test_linalg and gemm_bf16_cases.h:
//   |got - want| <= tol(f32) sqrt(k) scale,   tol(f32) = 1e-5 (about 84 f32 ulps)
// (random-sign terms: rounding errors add up like a random walk, ~sqrt(k) ulps). A bf16 C is
// the f32 result rounded once to bf16, compared with the exact result rounded to bf16: two
// roundings to nearest of values that are within the f32 bound of each other differ by at
// most half a bf16 ulp each (2^-8 relative) plus that bound:
//   |got - bf16(want)| <= 2^-8 (|got| + |bf16(want)|) + tol(f32) sqrt(k) scale.
// Inputs are exact f32 (or bf16) values, so the reference sees the numbers the kernel multiplies.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/cpu_features.h"
#include "core/half.h"
#include "core/parallel.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_packed.h"
#include "test_util.h"

namespace {

using ember::BFloat16;
using ember::cpu::PackedKernel;

struct ThreadCount {
  explicit ThreadCount(int n) : saved(ember::get_num_threads()) { ember::set_num_threads(n); }
  ~ThreadCount() { ember::set_num_threads(saved); }
  int saved;
};

struct Case {
  bool trans_a = false, trans_b = false;
  int64_t m = 1, n = 1, k = 1;
  int64_t pad_a = 0, pad_b = 0, pad_c = 0;  // ld = stored row length + pad
  float alpha = 1.0f, beta = 0.0f;

  std::string describe() const {
    return "m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
           (trans_a ? " A^T" : " A") + (trans_b ? " B^T" : " B") + " pads " + std::to_string(pad_a) + "/" +
           std::to_string(pad_b) + "/" + std::to_string(pad_c) + " alpha=" + std::to_string(alpha) +
           " beta=" + std::to_string(beta);
  }
  int64_t a_rows() const { return trans_a ? k : m; }
  int64_t a_cols() const { return trans_a ? m : k; }
  int64_t b_rows() const { return trans_b ? n : k; }
  int64_t b_cols() const { return trans_b ? k : n; }
  int64_t lda() const { return a_cols() + pad_a; }
  int64_t ldb() const { return b_cols() + pad_b; }
  int64_t ldc() const { return n + pad_c; }
};

template <class T>
constexpr const char* type_name() {
  return std::is_same_v<T, float> ? "f32" : "bf16";
}

// Random values in [-1, 1), exactly representable in T.
template <class T>
std::vector<T> random_values(size_t count) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<T> v(count);
  for (auto& x : v) x = T(dist(ember::testing::rng()));
  return v;
}

// The product, its absolute-value bound and the data of one case.
template <class TA, class TB, class TC>
struct Problem {
  Case g;
  std::vector<TA> a;
  std::vector<TB> b;
  std::vector<TC> c0;  // C before the call (NaN when beta == 0)
  std::vector<double> want, scale;

  explicit Problem(const Case& cs) : g(cs) {
    a = random_values<TA>(size_t(std::max<int64_t>(g.a_rows() * g.lda(), 1)));
    b = random_values<TB>(size_t(std::max<int64_t>(g.b_rows() * g.ldb(), 1)));
    c0 = random_values<TC>(size_t(std::max<int64_t>(g.m * g.ldc(), 1)));
    if (g.beta == 0.0f)
      for (auto& x : c0) x = TC(std::numeric_limits<float>::quiet_NaN());
    // op(A) by rows and op(B) by columns, in double, so the naive loops below run along memory.
    std::vector<double> a_rows(size_t(g.m * g.k)), b_cols(size_t(g.n * g.k));
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t p = 0; p < g.k; ++p)
        a_rows[size_t(i * g.k + p)] = float(g.trans_a ? a[size_t(p * g.lda() + i)] : a[size_t(i * g.lda() + p)]);
    for (int64_t j = 0; j < g.n; ++j)
      for (int64_t p = 0; p < g.k; ++p)
        b_cols[size_t(j * g.k + p)] = float(g.trans_b ? b[size_t(j * g.ldb() + p)] : b[size_t(p * g.ldb() + j)]);
    want.assign(size_t(g.m * g.n), 0.0);
    scale.assign(size_t(g.m * g.n), 0.0);
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) {
        const double* x = a_rows.data() + i * g.k;
        const double* y = b_cols.data() + j * g.k;
        double sum = 0.0, abs_sum = 0.0;
        for (int64_t p = 0; p < g.k; ++p) {
          sum += x[p] * y[p];
          abs_sum += std::abs(x[p] * y[p]);
        }
        const double seed = g.beta == 0.0f ? 0.0 : double(g.beta) * float(c0[size_t(i * g.ldc() + j)]);
        want[size_t(i * g.n + j)] = double(g.alpha) * sum + seed;
        scale[size_t(i * g.n + j)] = std::abs(double(g.alpha)) * abs_sum + std::abs(seed);
      }
  }

  std::vector<TC> run(PackedKernel kernel, bool threaded) const {
    std::vector<TC> c = c0;
    if (threaded)
      ember::cpu::packed_gemm(g.trans_a, g.trans_b, g.m, g.n, g.k, g.alpha, a.data(), g.lda(), b.data(), g.ldb(),
                              g.beta, c.data(), g.ldc(), kernel);
    else
      ember::cpu::packed_gemm_serial(g.trans_a, g.trans_b, g.m, g.n, g.k, g.alpha, a.data(), g.lda(), b.data(),
                                     g.ldb(), g.beta, c.data(), g.ldc(), kernel);
    return c;
  }

  ::testing::AssertionResult check(const std::vector<TC>& c) const {
    const double f32_rel = ember::testing::tolerance(ember::DType::f32) * std::sqrt(double(std::max<int64_t>(g.k, 1)));
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.ldc(); ++j) {
        const size_t at = size_t(i * g.ldc() + j);
        if (j >= g.n) {  // C's padding is not C: untouched, bit for bit (it may be NaN)
          if (std::memcmp(&c[at], &c0[at], sizeof(TC)) != 0)
            return ::testing::AssertionFailure() << "padding of C changed at row " << i << " column " << j;
          continue;
        }
        const double got = float(c[at]);
        double expected = want[size_t(i * g.n + j)];
        double bound = f32_rel * scale[size_t(i * g.n + j)];
        if constexpr (std::is_same_v<TC, BFloat16>) {
          expected = float(BFloat16(float(expected)));
          bound += std::ldexp(1.0, -8) * (std::abs(got) + std::abs(expected));
        }
        if (!(std::abs(got - expected) <= bound))
          return ::testing::AssertionFailure() << "at (" << i << ", " << j << "): got " << got << ", expected "
                                               << expected << " (bound " << bound << ")";
      }
    return ::testing::AssertionSuccess();
  }
};

template <class TA, class TB, class TC>
::testing::AssertionResult matches_reference(const Case& g, PackedKernel kernel, bool threaded = true) {
  const Problem<TA, TB, TC> p(g);
  ::testing::AssertionResult r = p.check(p.run(kernel, threaded));
  if (!r)
    r << " [" << g.describe() << ", " << type_name<TA>() << " inputs, " << type_name<TC>() << " out, "
      << ember::cpu::packed_kernel_name(kernel) << (threaded ? ", threaded" : ", serial") << "]";
  return r;
}

void expect_matches_in_every_type(const Case& g, PackedKernel kernel, bool threaded = true) {
  EXPECT_TRUE((matches_reference<float, float, float>(g, kernel, threaded)));
  EXPECT_TRUE((matches_reference<BFloat16, BFloat16, float>(g, kernel, threaded)));
  EXPECT_TRUE((matches_reference<BFloat16, BFloat16, BFloat16>(g, kernel, threaded)));
}

constexpr int64_t kSizes[] = {1, 7, 13, 17, 33, 64, 100, 257};
constexpr float kAlphas[] = {1.0f, -0.75f, 2.5f};
constexpr float kBetas[] = {0.0f, 1.0f, 0.5f};

// Every size as m, n and k in every layout, in a Latin square of (m, n, k) triples, with
// padded strides, alpha and beta varying from case to case.
void sizes_and_layouts(PackedKernel kernel) {
  constexpr int kCount = int(std::size(kSizes));
  int variant = 0;
  for (int layout = 0; layout < 4; ++layout)
    for (int i = 0; i < kCount; ++i)
      for (int j = 0; j < kCount; ++j, ++variant) {
        Case g;
        g.trans_a = layout & 1;
        g.trans_b = layout & 2;
        g.m = kSizes[i];
        g.n = kSizes[j];
        g.k = kSizes[(i + j + layout) % kCount];
        g.pad_a = (variant % 3) * 5;
        g.pad_b = ((variant + 1) % 3) * 3;
        g.pad_c = ((variant + 2) % 3) * 7;
        g.alpha = kAlphas[variant % 3];
        g.beta = kBetas[(variant / 3) % 3];
        expect_matches_in_every_type(g, kernel, /*threaded=*/variant % 2 == 0);
      }
}

// Inner dimensions of several chunks: equal chunks (1000 = 4 x 250), a chunk and a sliver
// (513), with every beta (a bf16 C goes through the f32 staging block here).
void long_inner_dimension(PackedKernel kernel) {
  int variant = 0;
  for (int layout = 0; layout < 4; ++layout)
    for (int64_t k : {513, 1000})
      for (float beta : kBetas) {
        Case g;
        g.trans_a = layout & 1;
        g.trans_b = layout & 2;
        g.m = 45 + variant;
        g.n = 70 - variant;
        g.k = k;
        g.pad_a = g.pad_b = g.pad_c = variant % 2 ? 3 : 0;
        g.alpha = kAlphas[variant % 3];
        g.beta = beta;
        ++variant;
        expect_matches_in_every_type(g, kernel);
      }
}

// A BERT-like shape larger than every block: the weight gradient dY^T X of a 2048-token batch
// through a 1024-wide layer, and the forward X W^T at the same size.
void bert_like(PackedKernel kernel) {
  Case dw;
  dw.trans_a = true;
  dw.m = 256;
  dw.k = 2048;
  dw.n = 1024;
  dw.beta = 1.0f;  // gradient accumulation
  EXPECT_TRUE((matches_reference<float, float, float>(dw, kernel)));
  EXPECT_TRUE((matches_reference<BFloat16, BFloat16, float>(dw, kernel)));
  Case fwd;
  fwd.trans_b = true;
  fwd.m = 2048;
  fwd.k = 256;
  fwd.n = 1024;
  EXPECT_TRUE((matches_reference<BFloat16, BFloat16, BFloat16>(fwd, kernel)));
  fwd.k = 1024;
  fwd.n = 256;
  fwd.beta = 0.5f;
  EXPECT_TRUE((matches_reference<BFloat16, BFloat16, BFloat16>(fwd, kernel)));
}

// Results for one and for two threads, bitwise: bands split rows (m >= n) or columns, every
// layout, every type, k of one chunk and of several.
template <class TA, class TB, class TC>
void expect_thread_count_changes_no_bit(PackedKernel kernel) {
  for (auto [m, n] : {std::pair<int64_t, int64_t>{301, 97}, {45, 333}})
    for (int64_t k : {200, 601})
      for (int layout = 0; layout < 4; ++layout) {
        Case g;
        g.trans_a = layout & 1;
        g.trans_b = layout & 2;
        g.m = m;
        g.n = n;
        g.k = k;
        g.pad_c = 5;
        g.alpha = 1.5f;
        g.beta = 0.5f;
        const Problem<TA, TB, TC> p(g);
        std::vector<TC> one, two;
        {
          ThreadCount tc(1);
          one = p.run(kernel, true);
        }
        {
          ThreadCount tc(2);
          two = p.run(kernel, true);
        }
        EXPECT_EQ(std::memcmp(one.data(), two.data(), one.size() * sizeof(TC)), 0)
            << g.describe() << " " << type_name<TA>() << " inputs, " << type_name<TC>() << " out";
        EXPECT_TRUE(p.check(one)) << g.describe();
      }
}

void thread_count_changes_no_bit(PackedKernel kernel) {
  expect_thread_count_changes_no_bit<float, float, float>(kernel);
  expect_thread_count_changes_no_bit<BFloat16, BFloat16, float>(kernel);
  expect_thread_count_changes_no_bit<BFloat16, BFloat16, BFloat16>(kernel);
}

// k == 0 and alpha == 0 leave C = beta * C; beta == 0 writes zeros over NaN; m or n == 0
// touches nothing (null pointers are fine).
template <class TIn, class TC>
void expect_degenerate_products(PackedKernel kernel) {
  for (float beta : kBetas)
    for (auto [k, alpha] : {std::pair<int64_t, float>{0, 1.0f}, {5, 0.0f}}) {
      Case g;
      g.m = 9;
      g.n = 20;
      g.k = k;
      g.pad_c = 3;
      g.alpha = alpha;
      g.beta = beta;
      const Problem<TIn, TIn, TC> p(g);
      const std::vector<TC> c = p.run(kernel, false);
      for (int64_t i = 0; i < g.m; ++i)
        for (int64_t j = 0; j < g.n; ++j) {
          const float before = float(p.c0[size_t(i * g.ldc() + j)]);
          const float expect = beta == 0.0f ? 0.0f : float(TC(beta * before));
          EXPECT_EQ(float(c[size_t(i * g.ldc() + j)]), expect) << g.describe() << " at " << i << ", " << j;
        }
      EXPECT_TRUE(p.check(c)) << g.describe();
    }
  ember::cpu::packed_gemm<TIn, TIn, TC>(false, false, 0, 5, 5, 1.0f, nullptr, 5, nullptr, 5, 0.0f, nullptr, 5,
                                            kernel);
  ember::cpu::packed_gemm<TIn, TIn, TC>(true, true, 5, 0, 5, 1.0f, nullptr, 5, nullptr, 5, 0.0f, nullptr, 5,
                                            kernel);
}

void degenerate_products(PackedKernel kernel) {
  expect_degenerate_products<float, float>(kernel);
  expect_degenerate_products<BFloat16, float>(kernel);
  expect_degenerate_products<BFloat16, BFloat16>(kernel);
}

// A bf16 C is rounded once, to nearest even, from the f32 result: sums of products of powers
// of two are exact in f32, so the rounding alone decides. With k over one chunk the value
// comes from the staging block.
void bf16_output_rounds_to_nearest_even(PackedKernel kernel) {
  for (int64_t k : {8, 700})
    // 1 + 2^-8 ties between bf16 neighbours 1 and 1 + 2^-7: even rounds it down to 1;
    // 1 + 3 * 2^-8 ties between 1 + 2^-7 and 1 + 2^-6: even rounds it up.
    for (auto [extra_terms, want] : {std::pair<int, float>{1, 1.0f}, {3, 1.015625f}}) {
      std::vector<BFloat16> av(size_t(k), BFloat16(0.0f)), bv(size_t(k), BFloat16(0.0f));
      av[0] = bv[0] = BFloat16(1.0f);
      for (int t = 1; t <= extra_terms; ++t)  // in the last chunk when k = 700
        av[size_t(k - t)] = bv[size_t(k - t)] = BFloat16(0.0625f);
      BFloat16 c(std::numeric_limits<float>::quiet_NaN());
      ember::cpu::packed_gemm_serial(false, false, 1, 1, k, 1.0f, av.data(), k, bv.data(), 1, 0.0f, &c, 1, kernel);
      EXPECT_EQ(float(c), want) << extra_terms << " terms of 2^-8, k = " << k;
    }
  // NaN stays NaN, infinities stay infinite, large finite values round like BFloat16(float).
  const std::vector<BFloat16> a = {BFloat16(std::nanf("")), BFloat16(1.0f)}, b = {BFloat16(1.0f), BFloat16(1e38f)};
  std::vector<BFloat16> c(4);
  ember::cpu::packed_gemm_serial(false, false, 2, 2, 1, 1e10f, a.data(), 1, b.data(), 2, 0.0f, c.data(), 2, kernel);
  EXPECT_TRUE(std::isnan(float(c[0])) && std::isnan(float(c[1])));
  EXPECT_EQ(float(c[2]), float(BFloat16(1e10f)));
  EXPECT_TRUE(std::isinf(float(c[3])) && float(c[3]) > 0);
}

// Full and edge tiles go through the same arithmetic: an entry computed in the middle of a
// large product equals the same entry computed alone (m = n = 1, an edge tile of its own).
void edge_tiles_match_full_tiles(PackedKernel kernel) {
  for (int64_t k : {100, 600}) {
    Case g;
    g.m = 40;
    g.n = 70;
    g.k = k;
    g.alpha = 0.75f;
    g.beta = 0.5f;
    const Problem<float, float, float> p(g);
    const std::vector<float> c = p.run(kernel, false);
    for (auto [i, j] : {std::pair<int64_t, int64_t>{0, 0}, {7, 17}, {39, 69}, {23, 47}}) {
      std::vector<float> row(p.a.begin() + i * g.lda(), p.a.begin() + i * g.lda() + g.k), col(size_t(g.k));
      for (int64_t q = 0; q < g.k; ++q) col[size_t(q)] = p.b[size_t(q * g.ldb() + j)];
      float alone = p.c0[size_t(i * g.ldc() + j)];
      ember::cpu::packed_gemm_serial(false, false, 1, 1, g.k, g.alpha, row.data(), g.k, col.data(), 1, g.beta, &alone,
                                     1, kernel);
      EXPECT_EQ(std::memcmp(&alone, &c[size_t(i * g.ldc() + j)], sizeof(float)), 0)
          << "entry " << i << ", " << j << " k " << k << ": " << alone << " vs " << c[size_t(i * g.ldc() + j)];
    }
  }
}

}  // namespace

// ---- the AVX2 kernel: every CPU Ember supports runs it

TEST(GemmPacked, KernelChoiceFollowsTheCpu) {
  EXPECT_TRUE(ember::cpu::packed_kernel_available(PackedKernel::Avx2));
  const PackedKernel chosen = ember::cpu::packed_kernel_for_this_cpu();
  EXPECT_TRUE(ember::cpu::packed_kernel_available(chosen));
  if (ember::cpu_capability() != ember::CpuCapability::Avx512) {
    EXPECT_EQ(chosen, PackedKernel::Avx2);
  }
  if (!ember::cpu::packed_kernel_available(PackedKernel::Avx512)) {
    float a = 1.0f, b = 1.0f, c = 0.0f;
    EXPECT_EMBER_ERROR(ember::cpu::packed_gemm_serial(false, false, 1, 1, 1, 1.0f, &a, 1, &b, 1, 0.0f, &c, 1,
                                                      PackedKernel::Avx512),
                       "cannot run the avx512 kernel");
  }
}

TEST(GemmPacked, SizesAndLayouts) { sizes_and_layouts(PackedKernel::Avx2); }
TEST(GemmPacked, LongInnerDimension) { long_inner_dimension(PackedKernel::Avx2); }
TEST(GemmPacked, BertLikeShapes) { bert_like(PackedKernel::Avx2); }
TEST(GemmPacked, ThreadCountChangesNoBit) { thread_count_changes_no_bit(PackedKernel::Avx2); }
TEST(GemmPacked, DegenerateProducts) { degenerate_products(PackedKernel::Avx2); }
TEST(GemmPacked, Bf16OutputRoundsToNearestEven) { bf16_output_rounds_to_nearest_even(PackedKernel::Avx2); }
TEST(GemmPacked, EdgeTilesMatchFullTiles) { edge_tiles_match_full_tiles(PackedKernel::Avx2); }

// Mixed precision through the threaded entry at sizes that leave ragged bands.
TEST(GemmPacked, SerialAndThreadedAgree) {
  ThreadCount tc(2);
  Case g;
  g.m = 130;
  g.n = 95;
  g.k = 300;
  g.trans_b = true;
  g.beta = 1.0f;
  const Problem<BFloat16, BFloat16, BFloat16> p(g);
  const auto serial = p.run(PackedKernel::Avx2, false), threaded = p.run(PackedKernel::Avx2, true);
  EXPECT_EQ(std::memcmp(serial.data(), threaded.data(), serial.size() * sizeof(BFloat16)), 0);
  EXPECT_TRUE(p.check(threaded));
}

// ---- the AVX-512 kernel, where the CPU has AVX-512F

class GemmPackedAvx512 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!ember::cpu_features().avx512f) GTEST_SKIP() << "this CPU has no AVX-512F for the avx512 packed GEMM kernel";
    if (!ember::cpu::packed_kernel_available(PackedKernel::Avx512))
      GTEST_SKIP() << "EMBER_CPU_CAPABILITY caps this run below AVX-512 for the avx512 packed GEMM kernel";
  }
};

TEST_F(GemmPackedAvx512, SizesAndLayouts) { sizes_and_layouts(PackedKernel::Avx512); }
TEST_F(GemmPackedAvx512, LongInnerDimension) { long_inner_dimension(PackedKernel::Avx512); }
TEST_F(GemmPackedAvx512, BertLikeShapes) { bert_like(PackedKernel::Avx512); }
TEST_F(GemmPackedAvx512, ThreadCountChangesNoBit) { thread_count_changes_no_bit(PackedKernel::Avx512); }
TEST_F(GemmPackedAvx512, DegenerateProducts) { degenerate_products(PackedKernel::Avx512); }
TEST_F(GemmPackedAvx512, Bf16OutputRoundsToNearestEven) { bf16_output_rounds_to_nearest_even(PackedKernel::Avx512); }
TEST_F(GemmPackedAvx512, EdgeTilesMatchFullTiles) { edge_tiles_match_full_tiles(PackedKernel::Avx512); }

// Both kernels sum every entry in the same order with the same chunks, so they agree bit for bit.
TEST_F(GemmPackedAvx512, MatchesTheAvx2KernelBitForBit) {
  for (int layout = 0; layout < 4; ++layout)
    for (int64_t k : {37, 700}) {
      Case g;
      g.trans_a = layout & 1;
      g.trans_b = layout & 2;
      g.m = 77;
      g.n = 90;
      g.k = k;
      g.pad_a = 2;
      g.alpha = -1.25f;
      g.beta = 0.5f;
      const Problem<BFloat16, BFloat16, BFloat16> p(g);
      const auto x = p.run(PackedKernel::Avx2, true), y = p.run(PackedKernel::Avx512, true);
      EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(BFloat16)), 0) << g.describe();
      const Problem<float, float, float> q(g);
      const auto u = q.run(PackedKernel::Avx2, true), v = q.run(PackedKernel::Avx512, true);
      EXPECT_EQ(std::memcmp(u.data(), v.data(), u.size() * sizeof(float)), 0) << g.describe();
    }
}

// Narrow f32 products (n <= kInPlaceMaxN) read A in place, and an untransposed B whose column
// panels are all whole, instead of packing them. Every row-panel height (whole panels of 12, the
// in-place tile's 8 and 4, a packed 5), one chunk of k and two, every layout, alpha and beta: the
// reference's values and the AVX2 kernel's bits (which packs everything).
TEST_F(GemmPackedAvx512, InPlaceOperandsKeepThePackedBits) {
  int variant = 0;
  for (int layout = 0; layout < 4; ++layout)
    for (int64_t m : {128, 64, 41, 24})
      for (int64_t n : {32, 64, 90, 128}) {
        Case g;
        g.trans_a = layout & 1;
        g.trans_b = layout & 2;
        g.m = m;
        g.n = n;
        g.k = variant % 2 ? 64 : 300;
        g.pad_a = (variant % 3) * 5;
        g.pad_b = ((variant + 1) % 3) * 3;
        g.pad_c = ((variant + 2) % 3) * 7;
        g.alpha = kAlphas[variant % 3];
        g.beta = kBetas[(variant / 3) % 3];
        ++variant;
        const Problem<float, float, float> p(g);
        const auto packed = p.run(PackedKernel::Avx2, false), in_place = p.run(PackedKernel::Avx512, false);
        EXPECT_EQ(std::memcmp(packed.data(), in_place.data(), packed.size() * sizeof(float)), 0) << g.describe();
        EXPECT_TRUE(p.check(in_place)) << g.describe();
      }
}

// The same on the AVX-512 kernel alone: a product 128 columns wide (operands in place) gives the
// bits of the first 128 columns of the same product 160 wide (operands packed).
TEST_F(GemmPackedAvx512, InPlaceAndPackedOperandsAgreeOnOneKernel) {
  for (int layout = 0; layout < 4; ++layout) {
    Case g;
    g.trans_a = layout & 1;
    g.trans_b = layout & 2;
    g.m = 128;
    g.n = 160;
    g.k = 128;
    g.beta = 0.5f;
    const Problem<float, float, float> p(g);
    const std::vector<float> wide = p.run(PackedKernel::Avx512, false);
    std::vector<float> narrow = p.c0;
    ember::cpu::packed_gemm_serial(g.trans_a, g.trans_b, g.m, 128, g.k, g.alpha, p.a.data(), g.lda(), p.b.data(),
                                   g.ldb(), g.beta, narrow.data(), g.ldc(), PackedKernel::Avx512);
    for (int64_t i = 0; i < g.m; ++i)
      ASSERT_EQ(std::memcmp(narrow.data() + i * g.ldc(), wide.data() + i * g.ldc(), 128 * sizeof(float)), 0)
          << "row " << i << " " << g.describe();
  }
}

// ---- the bias epilogue (packed_gemm's bias argument, cpu::gemm_bias): C = op(A) op(B) + bias
// must carry exactly the bits of seeding every row of C with the bias and accumulating the
// product onto it with beta = 1, for f32 and bf16 outputs, edge tiles, several k chunks (a bf16 C
// then waits in the staging block), column and row bands, and 1 or 2 threads.

namespace {

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

struct Shape3 {
  int64_t m, n, k;
  bool trans_a, trans_b;
  std::string describe() const {
    return "m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
           (trans_a ? " A^T" : " A") + (trans_b ? " B^T" : " B");
  }
};

// Full and edge tiles, one and several k chunks (kPackedKc = 256), and wide outputs that the
// threaded GEMM cuts into column bands.
const Shape3 kShapes[] = {{1, 1, 1, false, true},     {7, 19, 5, false, true},    {13, 33, 300, true, false},
                          {64, 100, 256, false, true}, {37, 1000, 600, true, true}, {300, 40, 64, false, false},
                          {48, 2050, 96, false, true}};

// C (m x n, row stride ldc = n + 3) from the bias epilogue and from seeding, for one element type.
template <class T, class Gemm, class Seeded>
void expect_epilogue_matches_seeding(const Gemm& with_bias, const Seeded& seeded) {
  for (const Shape3& s : kShapes) {
    for (int threads : {1, 2}) {
      SCOPED_TRACE(s.describe() + " threads=" + std::to_string(threads));
      ThreadCount tc(threads);
      const int64_t lda = s.trans_a ? s.m : s.k, ldb = s.trans_b ? s.k : s.n, ldc = s.n + 3;
      const auto a = random_values<T>(size_t(s.m * s.k)), b = random_values<T>(size_t(s.k * s.n));
      const auto bias = random_values<T>(size_t(s.n));
      std::vector<T> got(size_t(s.m * ldc), T(7.0f)), want(size_t(s.m * ldc), T(7.0f));
      for (int64_t i = 0; i < s.m; ++i)
        for (int64_t j = 0; j < s.n; ++j) want[size_t(i * ldc + j)] = bias[size_t(j)];
      with_bias(s, a.data(), lda, b.data(), ldb, bias.data(), got.data(), ldc);
      seeded(s, a.data(), lda, b.data(), ldb, want.data(), ldc);
      EXPECT_TRUE(same_bits(got, want));  // the padding after each row stays untouched too
    }
  }
}

template <class T>
void packed_epilogue_matches_seeding(PackedKernel kernel) {
  expect_epilogue_matches_seeding<T>(
      [&](const Shape3& s, const T* a, int64_t lda, const T* b, int64_t ldb, const T* bias, T* c, int64_t ldc) {
        ember::cpu::packed_gemm<T, T, T>(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc,
                                         kernel, bias);
      },
      [&](const Shape3& s, const T* a, int64_t lda, const T* b, int64_t ldb, T* c, int64_t ldc) {
        ember::cpu::packed_gemm<T, T, T>(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0f, a, lda, b, ldb, 1.0f, c, ldc,
                                         kernel);
      });
}

template <class T>
void gemm_bias_matches_seeded_gemm() {
  expect_epilogue_matches_seeding<T>(
      [](const Shape3& s, const T* a, int64_t lda, const T* b, int64_t ldb, const T* bias, T* c, int64_t ldc) {
        ember::cpu::gemm_bias(s.trans_a, s.trans_b, s.m, s.n, s.k, a, lda, b, ldb, bias, c, ldc);
      },
      [](const Shape3& s, const T* a, int64_t lda, const T* b, int64_t ldb, T* c, int64_t ldc) {
        if constexpr (std::is_same_v<T, float>)
          ember::cpu::gemm<float>(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0f, a, lda, b, ldb, 1.0f, c, ldc);
        else
          ember::cpu::gemm(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0f, a, lda, b, ldb, 1.0f, c, ldc);
      });
}

}  // namespace

TEST(GemmBias, PackedF32EpilogueMatchesSeeding) { packed_epilogue_matches_seeding<float>(PackedKernel::Avx2); }
TEST(GemmBias, PackedBf16EpilogueMatchesSeeding) { packed_epilogue_matches_seeding<BFloat16>(PackedKernel::Avx2); }
// The AVX-512 kernel, whose narrow f32 products (40 and 100 wide here) read their operands in place.
TEST_F(GemmPackedAvx512, F32EpilogueMatchesSeeding) { packed_epilogue_matches_seeding<float>(PackedKernel::Avx512); }
TEST(GemmBias, F32MatchesSeededGemm) { gemm_bias_matches_seeded_gemm<float>(); }
TEST(GemmBias, Bf16MatchesSeededGemm) { gemm_bias_matches_seeded_gemm<BFloat16>(); }

TEST(GemmBias, EmptyInnerDimensionGivesTheBias) {
  const std::vector<float> bias = {1.5f, -2.0f, 3.25f};
  std::vector<float> c(6, std::nanf(""));
  ember::cpu::packed_gemm<float, float, float>(false, true, 2, 3, 0, 1.0f, nullptr, 1, nullptr, 1, 0.0f, c.data(), 3,
                                               PackedKernel::Avx2, bias.data());
  EXPECT_EQ(c, std::vector<float>({1.5f, -2.0f, 3.25f, 1.5f, -2.0f, 3.25f}));
}

TEST(GemmBias, BiasWithNonzeroBetaIsAnError) {
  const std::vector<float> a(4, 1.0f), b(4, 1.0f), bias(2, 0.0f);
  std::vector<float> c(4, 0.0f);
  auto with_beta_one = [&] {
    ember::cpu::packed_gemm_serial<float, float, float>(false, false, 2, 2, 2, 1.0f, a.data(), 2, b.data(), 2, 1.0f,
                                                        c.data(), 2, PackedKernel::Avx2, bias.data());
  };
  EXPECT_THROW(with_beta_one(), ember::Error);
}
