// Ember's AMX bf16 GEMM (kernels/cpu/gemm_bf16_amx.h) on emulated tiles: the same packing,
// blocking and edge handling as the real kernel, with each tile instruction carried out in plain
// C++ (gemm_bf16_amx_emulated_serial), so these run on any CPU. What they cannot check is the
// hardware backend itself; test_gemm_bf16_amx runs the real instructions where the CPU has AMX.
//
// Results are checked against a double-precision sum of the same bf16 values with the bound of
// tests/ops/gemm_bf16_cases.h: entry (i, j) is a k-term sum in f32 rounded once to the output type,
//   |got - want| <= (tol(out) + tol(f32) sqrt(k)) (|alpha| (|A| |B|)_ij + |beta| |C0_ij|).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "kernels/cpu/gemm_bf16_amx.h"
#include "test_util.h"

namespace {

using ember::BFloat16;
using ember::DType;
using ember::testing::tolerance;

struct Problem {
  bool trans_a = false, trans_b = false;
  int64_t m = 1, n = 1, k = 1;
  int64_t pad_a = 0, pad_b = 0, pad_c = 0;  // ld = stored row length + pad
  float alpha = 1.0f, beta = 0.0f;
  bool f32_out = true;

  std::string describe() const {
    return "m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
           (trans_a ? " A^T" : " A") + (trans_b ? " B^T" : " B") + " pads " + std::to_string(pad_a) + "/" +
           std::to_string(pad_b) + "/" + std::to_string(pad_c) + " alpha=" + std::to_string(alpha) +
           " beta=" + std::to_string(beta) + (f32_out ? " f32 out" : " bf16 out");
  }
  int64_t lda() const { return (trans_a ? m : k) + pad_a; }
  int64_t ldb() const { return (trans_b ? k : n) + pad_b; }
  int64_t ldc() const { return n + pad_c; }
  double op_a(const std::vector<BFloat16>& a, int64_t i, int64_t kk) const {
    return float(trans_a ? a[size_t(kk * lda() + i)] : a[size_t(i * lda() + kk)]);
  }
  double op_b(const std::vector<BFloat16>& b, int64_t kk, int64_t j) const {
    return float(trans_b ? b[size_t(j * ldb() + kk)] : b[size_t(kk * ldb() + j)]);
  }
};

std::vector<BFloat16> random_bf16(size_t count) {
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<BFloat16> v(count);
  for (auto& x : v) x = BFloat16(dist(ember::testing::rng()));
  return v;
}

// Operands stored as the BLAS contract says; C random, or NaN where beta == 0 must leave it
// unread, its padding columns random either way.
struct Operands {
  std::vector<BFloat16> a, b;
  std::vector<float> c;  // C as f32 values, whichever the output type
};

Operands make_operands(const Problem& p) {
  Operands o;
  o.a = random_bf16(size_t((p.trans_a ? p.k : p.m) * p.lda()));
  o.b = random_bf16(size_t((p.trans_b ? p.n : p.k) * p.ldb()));
  const std::vector<BFloat16> c = random_bf16(size_t(p.m * p.ldc()));
  o.c.assign(c.begin(), c.end());
  if (p.beta == 0.0f)
    for (int64_t i = 0; i < p.m; ++i)
      std::fill_n(o.c.begin() + i * p.ldc(), p.n, std::numeric_limits<float>::quiet_NaN());
  return o;
}

// Runs the emulated kernel on C (in the problem's output type) and returns C as f32.
std::vector<float> run_emulated(const Problem& p, const Operands& o, std::vector<float> c) {
  if (p.f32_out) {
    ember::cpu::gemm_bf16_amx_emulated_serial(p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha, o.a.data(), p.lda(),
                                              o.b.data(), p.ldb(), p.beta, c.data(), p.ldc());
    return c;
  }
  std::vector<BFloat16> c16(c.begin(), c.end());
  ember::cpu::gemm_bf16_amx_emulated_serial(p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha, o.a.data(), p.lda(),
                                            o.b.data(), p.ldb(), p.beta, c16.data(), p.ldc());
  return std::vector<float>(c16.begin(), c16.end());
}

::testing::AssertionResult matches_reference(const Problem& p, const Operands& o, const std::vector<float>& got) {
  const double rel = tolerance(p.f32_out ? DType::f32 : DType::bf16) +
                     tolerance(DType::f32) * std::sqrt(double(std::max<int64_t>(p.k, 1)));
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      double sum = 0.0, sum_abs = 0.0;
      for (int64_t kk = 0; kk < p.k; ++kk) {
        const double x = p.op_a(o.a, i, kk), y = p.op_b(o.b, kk, j);
        sum += x * y;
        sum_abs += std::abs(x * y);
      }
      const double c0 = p.beta == 0.0f ? 0.0 : double(p.beta) * o.c[size_t(i * p.ldc() + j)];
      const double want = double(p.alpha) * sum + c0;
      const double bound = rel * (std::abs(double(p.alpha)) * sum_abs + std::abs(c0));
      const double value = got[size_t(i * p.ldc() + j)];
      if (!(std::abs(value - want) <= bound))
        return ::testing::AssertionFailure() << "C[" << i << "][" << j << "] = " << value << ", expected " << want
                                             << " (bound " << bound << ")";
    }
    for (int64_t j = p.n; j < p.ldc(); ++j) {
      const size_t at = size_t(i * p.ldc() + j);
      if (std::bit_cast<uint32_t>(got[at]) != std::bit_cast<uint32_t>(o.c[at]))
        return ::testing::AssertionFailure() << "padding C[" << i << "][" << j << "] changed";
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult emulated_matches_reference(const Problem& p) {
  const Operands o = make_operands(p);
  return matches_reference(p, o, run_emulated(p, o, o.c));
}

struct Scaling {
  float alpha, beta;
};
constexpr Scaling kScalings[] = {{1.0f, 0.0f}, {0.5f, 1.0f}, {-1.25f, -0.75f}, {2.0f, 0.5f}};
constexpr int64_t kPads[][3] = {{0, 0, 0}, {3, 1, 2}, {1, 5, 0}};

}  // namespace

// Shapes around the tile sizes (16 rows, 16 columns, 32 values of k): single entries, partial
// tiles in every dimension, odd k, k short of a tile, one and two tiles each way.
TEST(GemmBf16AmxEmulated, EveryLayoutMatchesReferenceAtTileEdges) {
  struct Shape3 {
    int64_t m, n, k;
  };
  const Shape3 shapes[] = {{1, 1, 1},   {64, 48, 40}, {33, 17, 70}, {16, 16, 32}, {32, 32, 64}, {17, 15, 31},
                           {31, 33, 33}, {5, 70, 3},   {48, 1, 96},  {2, 40, 65},  {15, 16, 2}};
  int variant = 0;
  for (const Shape3& s : shapes)
    for (int layout = 0; layout < 4; ++layout)
      for (bool f32_out : {true, false}) {
        Problem p;
        p.m = s.m;
        p.n = s.n;
        p.k = s.k;
        p.trans_a = layout & 1;
        p.trans_b = layout & 2;
        p.f32_out = f32_out;
        p.alpha = kScalings[variant % 4].alpha;
        p.beta = kScalings[variant % 4].beta;
        p.pad_a = kPads[variant % 3][0];
        p.pad_b = kPads[variant % 3][1];
        p.pad_c = kPads[variant % 3][2];
        ++variant;
        EXPECT_TRUE(emulated_matches_reference(p)) << p.describe();
      }
}

// Random shapes, layouts, strides, scalings and output types.
TEST(GemmBf16AmxEmulated, RandomProblemsMatchReference) {
  using ember::testing::uniform_int;
  for (int trial = 0; trial < 150; ++trial) {
    Problem p;
    p.m = uniform_int(1, 70);
    p.n = uniform_int(1, 70);
    p.k = uniform_int(1, 100);
    p.trans_a = ember::testing::coin();
    p.trans_b = ember::testing::coin();
    p.pad_a = uniform_int(0, 4);
    p.pad_b = uniform_int(0, 4);
    p.pad_c = uniform_int(0, 4);
    p.alpha = kScalings[uniform_int(0, 3)].alpha;
    p.beta = kScalings[uniform_int(0, 3)].beta;
    p.f32_out = ember::testing::coin();
    EXPECT_TRUE(emulated_matches_reference(p)) << p.describe();
  }
}

// The BERT products (hidden 64 here instead of 256 or 768, to keep the emulation quick): the
// forward X W^T, the input gradient dY W, the weight gradient dY^T X, and attention's per-head
// Q K^T and P V.
TEST(GemmBf16AmxEmulated, BertShapedProductsMatchReference) {
  struct Case {
    const char* name;
    bool trans_a, trans_b;
    int64_t m, n, k;
  };
  for (const Case& c : {Case{"forward x W^T", false, true, 96, 80, 64}, Case{"input grad dY W", false, false, 96, 64, 80},
                        Case{"weight grad dY^T X", true, false, 80, 64, 96},
                        Case{"attention Q K^T", false, true, 128, 128, 32}, Case{"attention P V", false, false, 128, 32, 128}})
    for (bool f32_out : {true, false}) {
      Problem p;
      p.trans_a = c.trans_a;
      p.trans_b = c.trans_b;
      p.m = c.m;
      p.n = c.n;
      p.k = c.k;
      p.f32_out = f32_out;
      p.beta = f32_out ? 1.0f : 0.0f;  // gradient accumulation into f32, a fresh bf16 output
      EXPECT_TRUE(emulated_matches_reference(p)) << c.name << ": " << p.describe();
    }
}

// k past one chunk of the k loop (512): C tiles go to the f32 staging rows and come back for the
// next chunk, and a bf16 C is still rounded once, at the end.
TEST(GemmBf16AmxEmulated, LongInnerDimensionsSpanSeveralChunks) {
  for (int64_t k : {1100, 545})
    for (bool f32_out : {true, false})
      for (int layout = 0; layout < 4; layout += 3) {
        Problem p;
        p.m = 40;
        p.n = 50;
        p.k = k;
        p.trans_a = layout & 1;
        p.trans_b = layout & 2;
        p.beta = -0.75f;
        p.pad_c = 3;
        p.f32_out = f32_out;
        EXPECT_TRUE(emulated_matches_reference(p)) << p.describe();
      }
}

// At k = 8192 a packed 16-row panel is 256 KiB, so a column block holds 64 columns and a row
// block 256 rows: products spanning several of each (B packed once per row block, or once in all
// when one column block covers n).
TEST(GemmBf16AmxEmulated, ProductsSpanningSeveralBlocksMatchReference) {
  struct Case {
    int64_t m, n;
    bool trans_a, trans_b;
  };
  for (const Case& c : {Case{20, 150, false, true}, Case{300, 20, true, false}, Case{270, 70, false, false}}) {
    Problem p;
    p.m = c.m;
    p.n = c.n;
    p.k = 8192;
    p.trans_a = c.trans_a;
    p.trans_b = c.trans_b;
    p.beta = 0.5f;
    p.pad_a = 1;
    EXPECT_TRUE(emulated_matches_reference(p)) << p.describe();
  }
}

// The sum for each entry runs in the same order in every band, so splitting C by rows or columns
// at multiples of 32 (as cpu::gemm's threads do) changes no bit.
TEST(GemmBf16AmxEmulated, BandsGiveTheSameBits) {
  for (int layout = 0; layout < 4; ++layout) {
    Problem p;
    p.m = 70;
    p.n = 75;
    p.k = 600;
    p.trans_a = layout & 1;
    p.trans_b = layout & 2;
    p.beta = 0.5f;
    const Operands o = make_operands(p);
    const std::vector<float> whole = run_emulated(p, o, o.c);
    std::vector<float> by_rows = o.c, by_cols = o.c;
    const int64_t lda = p.lda(), ldb = p.ldb(), ldc = p.ldc();
    for (int64_t i0 = 0; i0 < p.m; i0 += 32) {
      const int64_t rows = std::min<int64_t>(32, p.m - i0);
      const BFloat16* a = p.trans_a ? o.a.data() + i0 : o.a.data() + i0 * lda;
      ember::cpu::gemm_bf16_amx_emulated_serial(p.trans_a, p.trans_b, rows, p.n, p.k, p.alpha, a, lda, o.b.data(), ldb,
                                                p.beta, by_rows.data() + i0 * ldc, ldc);
    }
    for (int64_t j0 = 0; j0 < p.n; j0 += 32) {
      const int64_t cols = std::min<int64_t>(32, p.n - j0);
      const BFloat16* b = p.trans_b ? o.b.data() + j0 * ldb : o.b.data() + j0;
      ember::cpu::gemm_bf16_amx_emulated_serial(p.trans_a, p.trans_b, p.m, cols, p.k, p.alpha, o.a.data(), lda, b, ldb,
                                                p.beta, by_cols.data() + j0, ldc);
    }
    EXPECT_TRUE(matches_reference(p, o, whole)) << p.describe();
    EXPECT_EQ(std::memcmp(whole.data(), by_rows.data(), whole.size() * sizeof(float)), 0) << "row bands, " << layout;
    EXPECT_EQ(std::memcmp(whole.data(), by_cols.data(), whole.size() * sizeof(float)), 0) << "column bands, " << layout;
  }
}

// A bf16 C is rounded like BFloat16(float), to nearest even, from the f32 sum. Products of
// powers of two are exact, so the sum is exact and the rounding alone decides; NaN and
// infinity pass through.
TEST(GemmBf16AmxEmulated, Bf16OutputRoundsToNearestEven) {
  // 1 + 2^-8 lies halfway between bf16 neighbours 1 and 1 + 2^-7: even is 1. 1 + 3 * 2^-8 lies
  // halfway between 1 + 2^-7 and 1 + 2^-6: even is 1 + 2^-6.
  for (auto [terms, want] : {std::pair<int, float>{1, 1.0f}, {3, 1.015625f}}) {
    std::vector<BFloat16> a(40, BFloat16(0.0f)), b(40, BFloat16(0.0f));
    a[0] = b[0] = BFloat16(1.0f);
    for (int t = 1; t <= terms; ++t) a[size_t(t) * 2] = b[size_t(t) * 2] = BFloat16(0.0625f);
    BFloat16 c(0.0f);
    ember::cpu::gemm_bf16_amx_emulated_serial(false, false, 1, 1, 40, 1.0f, a.data(), 40, b.data(), 1, 0.0f, &c, 1);
    EXPECT_EQ(float(c), want) << terms << " terms of 2^-8";
  }
  const std::vector<BFloat16> a = {BFloat16(std::nanf("")), BFloat16(1.0f)}, b = {BFloat16(1.0f), BFloat16(1e38f)};
  std::vector<BFloat16> c(4, BFloat16(0.0f));
  ember::cpu::gemm_bf16_amx_emulated_serial(false, false, 2, 2, 1, 1e10f, a.data(), 1, b.data(), 2, 0.0f, c.data(), 2);
  EXPECT_TRUE(std::isnan(float(c[0])) && std::isnan(float(c[1])));
  EXPECT_EQ(float(c[2]), float(BFloat16(1e10f)));
  EXPECT_TRUE(std::isinf(float(c[3])) && float(c[3]) > 0);
}

// tdpbf16ps reads bf16 subnormals as zero (as vdpbf16ps and oneDNN's bf16 kernels do): a
// subnormal times 2^100 would otherwise give 2^-28.
TEST(GemmBf16AmxEmulated, SubnormalInputsCountAsZero) {
  BFloat16 subnormal;
  subnormal.bits = 0x0020;  // 2^-128, below the smallest normal bf16 2^-126
  ASSERT_EQ(float(subnormal), std::ldexp(1.0f, -128));
  const BFloat16 big(std::ldexp(1.0f, 100));
  for (bool f32_out : {true, false}) {
    float c = 1.0f;
    BFloat16 c16(1.0f);
    if (f32_out)
      ember::cpu::gemm_bf16_amx_emulated_serial(false, false, 1, 1, 1, 1.0f, &subnormal, 1, &big, 1, 0.0f, &c, 1);
    else
      ember::cpu::gemm_bf16_amx_emulated_serial(false, true, 1, 1, 1, 1.0f, &big, 1, &subnormal, 1, 0.0f, &c16, 1);
    EXPECT_EQ(f32_out ? c : float(c16), 0.0f) << (f32_out ? "f32" : "bf16") << " out";
  }
}

// k == 0 or alpha == 0: C = beta C, and beta == 0 writes zeros without reading C.
TEST(GemmBf16AmxEmulated, EmptyProductScalesC) {
  const BFloat16 one(1.0f);
  for (auto [k, alpha] : {std::pair<int64_t, float>{0, 1.0f}, {3, 0.0f}})
    for (float beta : {0.0f, 2.0f}) {
      const std::vector<BFloat16> ab(6, one);
      std::vector<float> c = {1, -2, 3, 4, 5, 6};
      if (beta == 0.0f) std::fill(c.begin(), c.end(), std::numeric_limits<float>::quiet_NaN());
      ember::cpu::gemm_bf16_amx_emulated_serial(false, false, 2, 3, k, alpha, ab.data(), std::max<int64_t>(k, 1),
                                                ab.data(), 3, beta, c.data(), 3);
      const std::vector<float> want = beta == 0.0f ? std::vector<float>(6, 0.0f) : std::vector<float>{2, -4, 6, 8, 10, 12};
      EXPECT_EQ(c, want) << "k " << k << " alpha " << alpha << " beta " << beta;
    }
}
