// Intel MKL's sgemm as an f32 GEMM path (kernels/cpu/mkl_sgemm.h): loaded at run time where it
// is installed (scripts/install_bench_libs.sh), so the product tests skip on machines without it
// and the error tests that need it absent skip where it is present. Against a double-precision
// naive product: all four layouts, odd sizes, padded strides, alpha and beta, NaN-filled C with
// beta == 0, k == 0, the bias epilogue, 1 and 2 threads; bad strides and a library that is not
// MKL are clear errors. Tolerance as in test_gemm_packed.cpp: 1e-5 sqrt(k) (|A||B| + |beta C|).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_f32_path.h"
#include "kernels/cpu/mkl_sgemm.h"

namespace {

using ember::cpu::F32GemmPath;

struct ForcedMkl {
  ForcedMkl() { ember::cpu::set_f32_gemm_path(F32GemmPath::Mkl); }
  ~ForcedMkl() { ember::cpu::set_f32_gemm_path(std::nullopt); }
};

struct Threads {
  explicit Threads(int n) : saved(ember::get_num_threads()) { ember::set_num_threads(n); }
  ~Threads() { ember::set_num_threads(saved); }
  int saved;
};

struct Case {
  bool trans_a, trans_b;
  int64_t m, n, k, pad;
  float alpha, beta;
};

std::vector<float> random_values(size_t count, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(count);
  for (float& x : v) x = u(rng);
  return v;
}

// C = alpha op(A) op(B) + beta C (or + bias) through cpu::gemm on the forced MKL path, checked
// entry by entry against the product in double.
void check_case(const Case& t, bool with_bias) {
  std::mt19937 rng(uint32_t(t.m * 131 + t.n * 17 + t.k));
  const int64_t lda = (t.trans_a ? t.m : t.k) + t.pad, ldb = (t.trans_b ? t.k : t.n) + t.pad, ldc = t.n + t.pad;
  const std::vector<float> a = random_values(size_t((t.trans_a ? t.k : t.m) * lda), rng);
  const std::vector<float> b = random_values(size_t((t.trans_b ? t.n : t.k) * ldb), rng);
  const std::vector<float> bias = random_values(size_t(t.n), rng);
  std::vector<float> c = random_values(size_t(t.m * ldc), rng);
  const std::vector<float> c0 = c;
  if (t.beta == 0.0f && !with_bias) std::fill(c.begin(), c.end(), std::numeric_limits<float>::quiet_NaN());
  {
    ForcedMkl forced;
    if (with_bias)
      ember::cpu::gemm_bias(t.trans_a, t.trans_b, t.m, t.n, t.k, a.data(), lda, b.data(), ldb, bias.data(), c.data(),
                            ldc);
    else
      ember::cpu::gemm(t.trans_a, t.trans_b, t.m, t.n, t.k, t.alpha, a.data(), lda, b.data(), ldb, t.beta, c.data(),
                       ldc);
  }
  const double alpha = with_bias ? 1.0 : t.alpha;
  for (int64_t i = 0; i < t.m; ++i)
    for (int64_t j = 0; j < t.n; ++j) {
      double want = 0, scale = 0;
      for (int64_t p = 0; p < t.k; ++p) {
        const double x = t.trans_a ? a[p * lda + i] : a[i * lda + p], y = t.trans_b ? b[j * ldb + p] : b[p * ldb + j];
        want += x * y, scale += std::abs(x * y);
      }
      want *= alpha, scale *= std::abs(alpha);
      const double start = with_bias ? bias[j] : t.beta == 0.0f ? 0.0 : double(t.beta) * c0[i * ldc + j];
      want += start, scale += std::abs(start);
      const double got = c[i * ldc + j];
      ASSERT_LE(std::abs(got - want), 1e-5 * std::sqrt(double(std::max<int64_t>(t.k, 1))) * scale + 1e-30)
          << "i=" << i << " j=" << j << " m=" << t.m << " n=" << t.n << " k=" << t.k << " trans " << t.trans_a
          << t.trans_b << " pad " << t.pad << " alpha " << t.alpha << " beta " << t.beta << " bias " << with_bias;
    }
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = [] {
    std::vector<Case> v;
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        v.push_back({ta, tb, 37, 53, 19, 0, 1.0f, 0.0f});     // odd, small
        v.push_back({ta, tb, 300, 260, 270, 3, 0.5f, 1.5f});  // above the size threshold, padded
        v.push_back({ta, tb, 5, 7, 0, 1, 1.0f, 0.25f});       // k == 0: C = beta C
      }
    return v;
  }();
  return all;
}

TEST(MklSgemm, MatchesAnF64ProductOnEveryLayoutAtOneAndTwoThreads) {
  if (!ember::cpu::mkl_status().loaded) GTEST_SKIP() << "MKL not installed: " << ember::cpu::mkl_status().problem;
  for (int threads : {1, 2}) {
    Threads scope(threads);
    for (const Case& t : cases()) check_case(t, /*with_bias=*/false);
  }
}

TEST(MklSgemm, BiasEpilogueMatchesAnF64Product) {
  if (!ember::cpu::mkl_status().loaded) GTEST_SKIP() << "MKL not installed: " << ember::cpu::mkl_status().problem;
  for (const Case& t : cases())
    if (t.k > 0) check_case(t, /*with_bias=*/true);
}

TEST(MklSgemm, StridesTooSmallAreAnErrorNotAMessageOnStderr) {
  if (!ember::cpu::mkl_status().loaded) GTEST_SKIP() << "MKL not installed";
  std::vector<float> a(64, 1.0f), b(64, 1.0f), c(64, 0.0f);
  try {
    ember::cpu::mkl_sgemm_serial(false, false, 4, 4, 8, 1.0f, a.data(), /*lda=*/4, b.data(), 4, 0.0f, c.data(), 4);
    FAIL() << "expected an ember::Error";
  } catch (const ember::Error& e) {
    EXPECT_NE(std::string(e.what()).find("lda=4"), std::string::npos) << e.what();
  }
  EXPECT_EQ(c[0], 0.0f);  // nothing written
}

TEST(MklSgemm, ForcingItWithoutMklIsAClearError) {
  if (ember::cpu::mkl_status().loaded) GTEST_SKIP() << "MKL is installed here";
  std::vector<float> a(4, 1.0f), b(4, 1.0f), c(4, 0.0f);
  ForcedMkl forced;
  try {
    ember::cpu::gemm(false, false, 2, 2, 2, 1.0f, a.data(), 2, b.data(), 2, 0.0f, c.data(), 2);
    FAIL() << "expected an ember::Error";
  } catch (const ember::Error& e) {
    EXPECT_NE(std::string(e.what()).find("MKL is not loaded"), std::string::npos) << e.what();
  }
}

TEST(MklSgemm, ProbingAMissingFileOrAnotherLibraryExplainsWhy) {
  const ember::cpu::MklStatus missing = ember::cpu::probe_mkl_library("/nonexistent/libmkl_rt.so.3");
  EXPECT_FALSE(missing.loaded);
  EXPECT_NE(missing.problem.find("/nonexistent/libmkl_rt.so.3"), std::string::npos) << missing.problem;
  const ember::cpu::MklStatus other = ember::cpu::probe_mkl_library("libm.so.6");
  EXPECT_FALSE(other.loaded);
  EXPECT_NE(other.problem.find("is not MKL's runtime library"), std::string::npos) << other.problem;
}

}  // namespace
