// The bf16 GEMM checks, shared by test_gemm_bf16 (the automatic path), test_gemm_bf16_fallback
// (EMBER_CPU_CAPABILITY=avx2, set before the first GEMM) and test_gemm_bf16_{onednn,avx512bf16,
// widened}, which force one path each with EMBER_BF16_GEMM (see force_path below).
//
// Tolerances, as in test_linalg: entry (i, j) is a k-term dot product accumulated in f32 and
// rounded once to the output dtype, so it is checked against
//   |got - want| <= (tol(out dtype) + tol(f32) * sqrt(k)) * (|alpha| (|A| |B|)_ij + |beta| |C0_ij|)
// with tol(bf16) = 1.6e-2 and tol(f32) = 1e-5 from the shared tolerance helper. Inputs are bf16
// values, so the reference sees exactly the numbers the kernel multiplies.
#pragma once
// Each executable names its own suite (e.g. GemmBf16Widened), so test names stay unique in ctest.
#ifndef GEMM_BF16_SUITE
#define GEMM_BF16_SUITE GemmBf16
#endif

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/cpu_features.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/reference/linalg.h"
#include "test_util.h"

namespace gemm_bf16_cases {

using namespace ember;
using ember::testing::all_close;
using ember::testing::random_tensor;
using ember::testing::tolerance;
using ember::testing::uniform_int;
using reference::RefTensor;

// Every test of an executable forced onto a path the CPU cannot run is skipped.
class SkipEveryTest : public ::testing::Environment {
 public:
  explicit SkipEveryTest(std::string why) : why_(std::move(why)) {}
  void SetUp() override { GTEST_SKIP() << why_; }

 private:
  std::string why_;
};

// Runs before main (call it from a namespace-scope initializer): sets EMBER_BF16_GEMM, read at
// the first bf16 GEMM, so that every check below runs on `path`; where the CPU cannot run the
// path, the variable stays unset and every test is skipped. Returns whether it forced the path.
inline bool force_path(cpu::Bf16GemmPath path) {
  if (!cpu::bf16_gemm_path_available(path)) {
    ::testing::AddGlobalTestEnvironment(new SkipEveryTest(std::string("this CPU cannot run the ") +
                                                          cpu::bf16_gemm_path_name(path) + " bf16 GEMM"));
    return false;
  }
  return setenv("EMBER_BF16_GEMM", cpu::bf16_gemm_path_name(path), 1) == 0;
}

inline RefTensor ref_abs(RefTensor r) {
  for (auto& v : r.data) v = std::abs(v);
  return r;
}

struct ThreadCount {
  explicit ThreadCount(int n) : saved(get_num_threads()) { set_num_threads(n); }
  ~ThreadCount() { set_num_threads(saved); }
  int saved;
};

// |got - want| <= rel * scale elementwise, rel from the output dtype and k (see top).
inline ::testing::AssertionResult within_bound(const std::vector<double>& got, const RefTensor& want,
                                               const RefTensor& scale, DType out_dtype, int64_t k) {
  const double rel = tolerance(out_dtype) + tolerance(DType::f32) * std::sqrt(double(std::max<int64_t>(k, 1)));
  if (got.size() != want.data.size())
    return ::testing::AssertionFailure() << got.size() << " values, expected " << want.data.size();
  for (size_t i = 0; i < got.size(); ++i) {
    const double bound = rel * scale.data[i];
    if (!(std::abs(got[i] - want.data[i]) <= bound))
      return ::testing::AssertionFailure() << "at flat index " << i << " of " << shape_str(want.shape) << ": got "
                                           << got[i] << ", expected " << want.data[i] << " (bound " << bound << ")";
  }
  return ::testing::AssertionSuccess();
}

// One cpu::gemm call on bf16 operands stored as the BLAS contract says (transposed operands
// stored transposed, rows padded so ld exceeds the row length), checked against the reference.
struct GemmCase {
  bool trans_a = false, trans_b = false;
  int64_t m = 1, n = 1, k = 1;
  int64_t pad_a = 0, pad_b = 0, pad_c = 0;  // ld = row length + pad
  float alpha = 1.0f, beta = 0.0f;
  DType out = DType::bf16;

  std::string describe() const {
    return std::string("m=") + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
           (trans_a ? " A^T" : " A") + (trans_b ? " B^T" : " B") + " pads " + std::to_string(pad_a) + "/" +
           std::to_string(pad_b) + "/" + std::to_string(pad_c) + " alpha=" + std::to_string(alpha) +
           " beta=" + std::to_string(beta) + (out == DType::f32 ? " f32 out" : " bf16 out");
  }
};

// The op(X) view of a stored matrix: narrow off the padding, transpose when stored transposed.
inline Tensor logical(const Tensor& stored, int64_t cols, bool transposed) {
  const Tensor narrowed = stored.narrow(1, 0, cols);
  return transposed ? narrowed.t() : narrowed;
}

inline ::testing::AssertionResult gemm_matches_reference(const GemmCase& g) {
  const int64_t a_rows = g.trans_a ? g.k : g.m, a_cols = g.trans_a ? g.m : g.k;
  const int64_t b_rows = g.trans_b ? g.n : g.k, b_cols = g.trans_b ? g.k : g.n;
  const int64_t lda = a_cols + g.pad_a, ldb = b_cols + g.pad_b, ldc = g.n + g.pad_c;
  const Tensor a = random_tensor({a_rows, lda}, DType::bf16), b = random_tensor({b_rows, ldb}, DType::bf16);
  Tensor c = random_tensor({g.m, ldc}, g.out);
  // beta == 0 must not read C: fill it with NaN so any read shows up.
  if (g.beta == 0.0f) c.fill_(std::numeric_limits<double>::quiet_NaN());
  const RefTensor c0 = reference::from_tensor(c.narrow(1, 0, g.n));
  const std::vector<double> pad_before = c.narrow(1, g.n, g.pad_c).to_vector<double>();
  const RefTensor ra = reference::from_tensor(logical(a, a_cols, g.trans_a));
  const RefTensor rb = reference::from_tensor(logical(b, b_cols, g.trans_b));

  if (g.out == DType::f32)
    cpu::gemm(g.trans_a, g.trans_b, g.m, g.n, g.k, g.alpha, a.data_ptr<BFloat16>(), lda, b.data_ptr<BFloat16>(), ldb,
              g.beta, c.data_ptr<float>(), ldc);
  else
    cpu::gemm(g.trans_a, g.trans_b, g.m, g.n, g.k, g.alpha, a.data_ptr<BFloat16>(), lda, b.data_ptr<BFloat16>(), ldb,
              g.beta, c.data_ptr<BFloat16>(), ldc);

  RefTensor want({g.m, g.n}), scale({g.m, g.n});
  const RefTensor prod = reference::matmul(ra, rb), prod_abs = reference::matmul(ref_abs(ra), ref_abs(rb));
  for (size_t i = 0; i < want.data.size(); ++i) {
    const double seed = g.beta == 0.0f ? 0.0 : double(g.beta) * c0.data[i];
    want.data[i] = double(g.alpha) * prod.data[i] + seed;
    scale.data[i] = std::abs(double(g.alpha)) * prod_abs.data[i] + std::abs(seed);
  }
  // C's padding columns are not C: they stay as they were (NaN compares unequal, so compare bits).
  const std::vector<double> pad_after = c.narrow(1, g.n, g.pad_c).to_vector<double>();
  for (size_t i = 0; i < pad_after.size(); ++i)
    if (std::memcmp(&pad_after[i], &pad_before[i], sizeof(double)) != 0)
      return ::testing::AssertionFailure() << "padding of C changed at " << i << ": " << pad_before[i] << " -> "
                                           << pad_after[i];
  return within_bound(c.narrow(1, 0, g.n).to_vector<double>(), want, scale, g.out, g.k);
}

inline GemmCase random_case(int64_t max_dim, bool allow_zero) {
  GemmCase g;
  const int64_t lo = allow_zero ? 0 : 1;
  g.m = uniform_int(lo, max_dim);
  g.n = uniform_int(lo, max_dim);
  g.k = uniform_int(lo, max_dim);
  g.trans_a = uniform_int(0, 1) == 1;
  g.trans_b = uniform_int(0, 1) == 1;
  g.pad_a = uniform_int(0, 1) * uniform_int(1, 5);
  g.pad_b = uniform_int(0, 1) * uniform_int(1, 5);
  g.pad_c = uniform_int(0, 1) * uniform_int(1, 5);
  const float alphas[] = {1.0f, 0.5f, -1.25f, 2.0f};
  const float betas[] = {0.0f, 1.0f, -0.75f, 0.5f};
  g.alpha = alphas[uniform_int(0, 3)];
  g.beta = betas[uniform_int(0, 3)];
  g.out = uniform_int(0, 1) == 1 ? DType::f32 : DType::bf16;
  return g;
}

// Products matmul reaches with bf16 operands: [B, n, k] views against [k, m] or batched ones.
inline ::testing::AssertionResult product_matches_reference(const Tensor& got, const RefTensor& ra,
                                                            const RefTensor& rb, int64_t k) {
  if (got.dtype() != DType::bf16) return ::testing::AssertionFailure() << "dtype " << got.dtype() << " != bf16";
  const RefTensor want = reference::matmul(ra, rb);
  if (got.shape() != want.shape)
    return ::testing::AssertionFailure() << "shape " << shape_str(got.shape()) << " != " << shape_str(want.shape);
  return within_bound(got.to_vector<double>(), want, reference::matmul(ref_abs(ra), ref_abs(rb)), DType::bf16, k);
}

inline Tensor maybe_transposed(const Shape& shape, bool transposed) {
  if (!transposed) return random_tensor(shape, DType::bf16);
  Shape s = shape;
  std::swap(s[s.size() - 1], s[s.size() - 2]);
  return random_tensor(s, DType::bf16).transpose(-1, -2);
}

}  // namespace gemm_bf16_cases

// ---- cpu::gemm on bf16 operands

TEST(GEMM_BF16_SUITE, SmallAndDegenerateShapesMatchReference) {
  using namespace gemm_bf16_cases;
  for (int trial = 0; trial < 300; ++trial) {
    const GemmCase g = random_case(9, /*allow_zero=*/trial % 3 == 0);
    EXPECT_TRUE(gemm_matches_reference(g)) << g.describe();
  }
}

TEST(GEMM_BF16_SUITE, GemmSizedShapesMatchReferenceAtOneAndTwoThreads) {
  using namespace gemm_bf16_cases;
  for (int threads : {1, 2}) {
    ThreadCount tc(threads);
    for (int trial = 0; trial < 60; ++trial) {
      GemmCase g = random_case(1, false);
      g.m = uniform_int(17, 150);  // odd sizes past every small-product cutoff
      g.n = uniform_int(17, 150);
      g.k = uniform_int(17, 150);
      EXPECT_TRUE(gemm_matches_reference(g)) << threads << " threads, " << g.describe();
    }
  }
}

TEST(GEMM_BF16_SUITE, BandsSplitByRowsAndByColumnsMatchReference) {
  using namespace gemm_bf16_cases;
  ThreadCount tc(2);
  for (bool trans_a : {false, true})
    for (bool trans_b : {false, true})
      for (auto [m, n] : {std::pair<int64_t, int64_t>{301, 40}, {40, 301}, {257, 255}}) {
        GemmCase g;
        g.trans_a = trans_a;
        g.trans_b = trans_b;
        g.m = m;
        g.n = n;
        g.k = 96;
        g.pad_a = 3;
        g.pad_c = 1;
        g.beta = 1.0f;
        for (DType out : {DType::bf16, DType::f32}) {
          g.out = out;
          EXPECT_TRUE(gemm_matches_reference(g)) << g.describe();
        }
      }
}

// Large enough for the blocked kernels' full tiles and remainders in every dimension.
TEST(GEMM_BF16_SUITE, LargeProductsMatchReference) {
  using namespace gemm_bf16_cases;
  ThreadCount tc(2);
  for (bool trans_b : {false, true}) {
    GemmCase g;
    g.m = 515;
    g.n = 387;
    g.k = 258;
    g.trans_b = trans_b;
    for (DType out : {DType::bf16, DType::f32}) {
      g.out = out;
      EXPECT_TRUE(gemm_matches_reference(g)) << g.describe();
    }
  }
}

// Inner dimensions past the blocked kernel's chunk length (512): several chunks accumulated in
// f32 (in a staging block for a bf16 C, rounded once), the last chunk odd for odd k.
TEST(GEMM_BF16_SUITE, LongInnerDimensionsMatchReference) {
  using namespace gemm_bf16_cases;
  for (int trial = 0; trial < 8; ++trial) {
    GemmCase g = random_case(1, false);
    g.m = uniform_int(20, 45);
    g.n = uniform_int(20, 70);
    g.k = trial % 2 == 0 ? 1101 : uniform_int(513, 1600);
    g.beta = trial % 4 < 2 ? 0.0f : -0.75f;
    g.out = trial % 3 == 0 ? DType::f32 : DType::bf16;
    EXPECT_TRUE(gemm_matches_reference(g)) << g.describe();
  }
}

// The blocked kernel sizes its row and column blocks from k (about 380 rows by 740 columns at
// k = 1030, 250 by 510 at k = 512): products spanning two or more blocks each way, with and
// without inner-dimension chunks, on one thread so that one band does.
TEST(GEMM_BF16_SUITE, ProductsSpanningSeveralBlocksMatchReference) {
  using namespace gemm_bf16_cases;
  ThreadCount tc(1);
  struct Shape3 {
    int64_t m, n, k;
    bool trans_a, trans_b;
    DType out;
  };
  for (const Shape3& s : {Shape3{400, 20, 1030, false, true, DType::bf16},
                          Shape3{21, 750, 1030, true, false, DType::bf16},
                          Shape3{260, 20, 512, true, true, DType::f32},
                          Shape3{20, 530, 512, false, false, DType::f32}}) {
    GemmCase g;
    g.m = s.m;
    g.n = s.n;
    g.k = s.k;
    g.trans_a = s.trans_a;
    g.trans_b = s.trans_b;
    g.out = s.out;
    g.pad_a = 2;
    g.pad_b = 1;
    g.beta = 0.5f;
    EXPECT_TRUE(gemm_matches_reference(g)) << g.describe();
  }
}

// Shapes on which oneDNN 2.6.3's AMX kernel executes an illegal instruction; they must still
// give correct results.
TEST(GEMM_BF16_SUITE, InnerDimensionsOneDnnMishandlesAreCorrect) {
  using namespace gemm_bf16_cases;
  for (auto [m, k] : {std::pair<int64_t, int64_t>{200, 63}, {70, 63}, {70, 2303}}) {
    GemmCase g;
    g.m = m;
    g.n = 45;
    g.k = k;
    EXPECT_TRUE(gemm_matches_reference(g)) << g.describe();
  }
}

TEST(GEMM_BF16_SUITE, AlphaAndBetaFollowBlasSemantics) {
  using namespace gemm_bf16_cases;
  for (DType out : {DType::bf16, DType::f32})
    for (int64_t size : {5, 40})
      for (float alpha : {1.0f, 0.0f, -0.5f, 3.0f})
        for (float beta : {0.0f, 1.0f, 2.0f, -1.0f}) {
          GemmCase g;
          g.m = size;
          g.n = size + 3;
          g.k = size + 2;
          g.alpha = alpha;
          g.beta = beta;
          g.out = out;
          EXPECT_TRUE(gemm_matches_reference(g)) << g.describe();
        }
}

TEST(GEMM_BF16_SUITE, EmptyInnerDimensionScalesC) {
  using namespace ember;
  for (float beta : {0.0f, 2.0f}) {
    Tensor c = from_vector<float>({1, -2, 3, 4, 5, 6}, {2, 3});
    if (beta == 0.0f) c.fill_(std::numeric_limits<double>::quiet_NaN());
    const BFloat16 dummy[1] = {};
    cpu::gemm(false, false, 2, 3, 0, 1.0f, dummy, 1, dummy, 3, beta, c.data_ptr<float>(), 3);
    const std::vector<float> want = beta == 0.0f ? std::vector<float>(6, 0.0f)
                                                 : std::vector<float>{2, -4, 6, 8, 10, 12};
    EXPECT_EQ(c.to_vector<float>(), want) << "beta " << beta;
  }
}

TEST(GEMM_BF16_SUITE, ManyDistinctShapesStayCorrect) {
  // More shapes than any cache of them holds; an early shape again after the rest.
  using namespace gemm_bf16_cases;
  for (int64_t m = 40; m < 40 + 300; ++m) {
    GemmCase g;
    g.m = m;
    g.n = 40;
    g.k = 42;
    g.out = m % 2 == 0 ? DType::f32 : DType::bf16;
    if (m % 37 == 0) EXPECT_TRUE(gemm_matches_reference(g)) << g.describe();
    else {
      // Running is enough to fill the cache; the checked ones above verify results.
      const Tensor a = random_tensor({g.m, g.k}, DType::bf16), b = random_tensor({g.k, g.n}, DType::bf16);
      Tensor c = random_tensor({g.m, g.n}, DType::f32);
      cpu::gemm(false, false, g.m, g.n, g.k, 1.0f, a.data_ptr<BFloat16>(), g.k, b.data_ptr<BFloat16>(), g.n, 0.0f,
                c.data_ptr<float>(), g.n);
    }
  }
  GemmCase first;
  first.m = 40;
  first.n = 40;
  first.k = 42;
  EXPECT_TRUE(gemm_matches_reference(first));
}

TEST(GEMM_BF16_SUITE, ThreadCountDoesNotChangeResultsBeyondRounding) {
  using namespace gemm_bf16_cases;
  const Tensor a = random_tensor({4, 64, 200}, DType::bf16), b = random_tensor({200, 96}, DType::bf16);
  Tensor one, two;
  {
    ThreadCount tc(1);
    one = matmul(a, b);
  }
  {
    ThreadCount tc(2);
    two = matmul(a, b);
  }
  // Both are f32 sums rounded once to bf16; summation order may move a value by one bf16 ulp.
  EXPECT_TRUE(all_close(two.to(DType::f32), one.to(DType::f32), 1e-2, 1e-2));
}

// ---- matmul, bmm and linear on bf16 tensors

TEST(GEMM_BF16_SUITE, MatmulOfBf16TensorsMatchesReference) {
  using namespace gemm_bf16_cases;
  for (int threads : {1, 2}) {
    ThreadCount tc(threads);
    for (int trial = 0; trial < 12; ++trial) {
      const int64_t batch = uniform_int(1, 3), n = uniform_int(1, 90), k = uniform_int(1, 90), m = uniform_int(1, 90);
      const bool ta = uniform_int(0, 1) == 1, tb = uniform_int(0, 1) == 1;
      const Tensor a = maybe_transposed({batch, n, k}, ta);
      const Tensor b2 = maybe_transposed({k, m}, tb), b3 = maybe_transposed({batch, k, m}, tb);
      const RefTensor ra = reference::from_tensor(a);
      EXPECT_TRUE(product_matches_reference(matmul(a, b2), ra, reference::from_tensor(b2), k))
          << threads << " threads, [" << batch << ", " << n << ", " << k << "] @ [" << k << ", " << m << "] " << ta
          << tb;
      EXPECT_TRUE(product_matches_reference(matmul(a, b3), ra, reference::from_tensor(b3), k))
          << threads << " threads, batched [" << batch << ", " << n << ", " << k << "] " << ta << tb;
      EXPECT_TRUE(product_matches_reference(bmm(a, b3), ra, reference::from_tensor(b3), k))
          << threads << " threads, bmm [" << batch << ", " << n << ", " << k << "] " << ta << tb;
    }
  }
  // size-0 and size-1 dims, 1-D operands
  for (const auto& [sa, sb] : std::vector<std::pair<Shape, Shape>>{{{0, 5}, {5, 3}},
                                                                   {{4, 0}, {0, 3}},
                                                                   {{2, 0, 5}, {5, 6}},
                                                                   {{1, 1}, {1, 1}},
                                                                   {{7}, {7, 33}},
                                                                   {{40, 33}, {33}},
                                                                   {{65}, {65}}}) {
    const Tensor a = random_tensor(sa, DType::bf16), b = random_tensor(sb, DType::bf16);
    const RefTensor ra = reference::from_tensor(a), rb = reference::from_tensor(b);
    EXPECT_TRUE(product_matches_reference(matmul(a, b), ra, rb, sa.back())) << shape_str(sa) << " @ " << shape_str(sb);
  }
}

TEST(GEMM_BF16_SUITE, LinearOfBf16TensorsMatchesReference) {
  using namespace gemm_bf16_cases;
  for (int threads : {1, 2}) {
    ThreadCount tc(threads);
    for (bool with_bias : {true, false})
      for (const Shape& lead : {Shape{}, Shape{70}, Shape{3, 41}, Shape{0}}) {
        const int64_t in = uniform_int(1, 120), out = uniform_int(1, 120);
        Shape xs = lead;
        xs.push_back(in);
        const Tensor x = random_tensor(xs, DType::bf16), w = random_tensor({out, in}, DType::bf16);
        const Tensor b = with_bias ? random_tensor({out}, DType::bf16) : Tensor();
        const Tensor y = linear(x, w, b);
        EXPECT_EQ(y.dtype(), DType::bf16);
        const RefTensor rx = reference::from_tensor(x), rw = reference::from_tensor(w);
        const RefTensor rb = with_bias ? reference::from_tensor(b) : RefTensor();
        const RefTensor want = reference::linear(rx, rw, rb, with_bias);
        const RefTensor scale = reference::linear(ref_abs(rx), ref_abs(rw), ref_abs(rb), with_bias);
        EXPECT_TRUE(within_bound(y.to_vector<double>(), want, scale, DType::bf16, in + 1))
            << threads << " threads, x " << shape_str(xs) << ", w [" << out << ", " << in << "], bias " << with_bias;
      }
  }
}

// The bf16 product reads its operands in place: the output is the only allocation.
TEST(GEMM_BF16_SUITE, LinearAllocatesOnlyItsOutput) {
  using namespace gemm_bf16_cases;
  const Tensor x = random_tensor({3, 30, 40}, DType::bf16), w = random_tensor({48, 40}, DType::bf16);
  const Tensor bias = random_tensor({48}, DType::bf16);
  const int64_t before = cpu_allocator().stats().num_allocations;
  const Tensor y = linear(x, w, bias);
  EXPECT_EQ(cpu_allocator().stats().num_allocations - before, 1);
}
