// The float-lane approximations of kernels/cpu (vec8::exp8 and the GELU formulas of
// gelu_lanes.inc) against double precision over dense sweeps: about a million floats of a range,
// evenly spaced in their bit patterns, so each binade gets its share. Errors are counted in units
// in the last place (ulp) of the float result (where it is a normal float), or, where a result is
// a difference of larger terms (the GELU derivatives, the tanh form's 1 + tanh), of the larger
// term: those cancel, and the float formulas cannot do better than a few ulps of the terms there.
// The bounds asserted are the measured worst cases, rounded up.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "ember/ember.h"
#include "kernels/cpu/gelu_math.h"

namespace {

using ember::cpu::vec8::f8;

// Floats in [lo, hi] spaced evenly in their ordered bit patterns (about `count` of them).
std::vector<float> sweep(float lo, float hi, int64_t count) {
  auto key = [](float f) {
    const int32_t b = std::bit_cast<int32_t>(f);
    return b < 0 ? int64_t(-(b & 0x7fffffff)) : int64_t(b);
  };
  auto from_key = [](int64_t k) {
    return k < 0 ? std::bit_cast<float>(uint32_t(-k) | 0x80000000u) : std::bit_cast<float>(uint32_t(k));
  };
  const int64_t k0 = key(lo), k1 = key(hi);
  const int64_t stride = std::max<int64_t>(1, (k1 - k0) / count);
  std::vector<float> xs;
  for (int64_t k = k0; k <= k1; k += stride) xs.push_back(from_key(k));
  return xs;
}

// One ulp of a float of magnitude |s| (s a normal float's magnitude).
double ulp_of(double s) {
  int e;
  std::frexp(std::fabs(s), &e);  // |s| = m 2^e, m in [0.5, 1)
  return std::ldexp(1.0, e - 24);
}

struct Worst {
  double ulps = 0;
  float at = 0;
};

// Largest |f(x) - want(x)| / ulp(scale(x)) over xs where |scale(x)| is a normal float, applying f
// to 8 lanes at a time.
Worst worst_ulps(const std::vector<float>& xs, const std::function<f8(f8)>& f,
                 const std::function<double(double)>& want, const std::function<double(double)>& scale) {
  Worst w;
  for (size_t i = 0; i < xs.size(); i += 8) {
    f8 v{};
    for (size_t k = 0; k < 8; ++k) v[k] = xs[std::min(i + k, xs.size() - 1)];
    const f8 y = f(v);
    for (size_t k = 0; k < 8 && i + k < xs.size(); ++k) {
      const double x = double(v[k]);
      if (!(std::fabs(scale(x)) >= FLT_MIN)) continue;
      const double e = std::fabs(double(y[k]) - want(x)) / ulp_of(scale(x));
      if (!(e <= w.ulps)) w = {e, v[k]};  // a NaN result counts as the worst
    }
  }
  return w;
}

double phi(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }
double pdf(double x) { return std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI); }
double tanh_inner(double x) { return std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x); }

constexpr int64_t kPoints = 1 << 20;

}  // namespace

TEST(LaneMath, ExpWithinOneAndAHalfUlps) {
  // down to where e^x is the smallest normal float, up to the clamp at 88
  const Worst w = worst_ulps(
      sweep(-87.33f, 88.0f, kPoints), [](f8 v) { return ember::cpu::vec8::exp8(v); },
      [](double x) { return std::exp(x); }, [](double x) { return std::exp(x); });
  EXPECT_LE(w.ulps, 1.5) << "at x = " << w.at;
}

TEST(LaneMath, ExpUnderflowsToExactZeroAndKeepsNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : sweep(-1e30f, -87.7f, 4096)) {
    EXPECT_EQ(ember::cpu::vec8::exp8(f8{} + x)[0], 0.0f) << x;
  }
  const f8 y = ember::cpu::vec8::exp8(f8{-inf, NAN, 0.0f, -0.0f, 1.0f, -1.0f, 88.0f, 1e30f});
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_TRUE(std::isnan(y[1]));
  EXPECT_EQ(y[2], 1.0f);
  EXPECT_EQ(y[3], 1.0f);
  EXPECT_NEAR(y[4], std::exp(1.0), 2e-7);
  EXPECT_EQ(y[6], y[7]);  // clamped at 88: large, finite
  EXPECT_TRUE(std::isfinite(y[7]));
}

TEST(LaneMath, ExactGeluWithinFiveUlps) {
  // x Phi(x), relative to the result, wherever it and Phi(x) are normal floats (x >= -12.9)
  const Worst w = worst_ulps(
      sweep(-12.9f, 30.0f, kPoints), [](f8 v) { return ember::cpu::vec8::gelu8(v); },
      [](double x) { return x * phi(x); }, [](double x) { return x * phi(x); });
  EXPECT_LE(w.ulps, 4.5) << "at x = " << w.at;
  // the derivative Phi(x) + x phi(x), in ulps of its larger term
  const Worst d = worst_ulps(
      sweep(-12.9f, 30.0f, kPoints), [](f8 v) { return ember::cpu::vec8::gelu_grad8(v); },
      [](double x) { return phi(x) + x * pdf(x); }, [](double x) { return std::max(phi(x), std::fabs(x * pdf(x))); });
  EXPECT_LE(d.ulps, 5.0) << "at x = " << d.at;
}

TEST(LaneMath, ExactGeluAtTheExtremes) {
  // past |x| = 13.3 Phi(-|x|) is exactly 0: gelu is x or 0, gelu' 1 or 0, at +-inf too; NaN
  // stays NaN
  const float inf = std::numeric_limits<float>::infinity();
  const f8 x{-inf, -1e30f, -20.0f, -13.3f, 13.3f, 20.0f, inf, NAN};
  const f8 y = ember::cpu::vec8::gelu8(x), d = ember::cpu::vec8::gelu_grad8(x);
  for (int k = 0; k < 7; ++k) {
    EXPECT_EQ(y[k], x[k] > 0 ? x[k] : 0.0f) << x[k];
    EXPECT_EQ(d[k], x[k] > 0 ? 1.0f : 0.0f) << x[k];
  }
  EXPECT_TRUE(std::isnan(y[7]));
  EXPECT_TRUE(std::isnan(d[7]));
}

TEST(LaneMath, TanhGeluWithinAFewUlpsOfItsTerms) {
  // 0.5 x (1 + tanh(u)): 1 + tanh(u) cancels for negative x, so in ulps of 0.5 x
  const Worst w = worst_ulps(
      sweep(-10.0f, 30.0f, kPoints), [](f8 v) { return ember::cpu::vec8::gelu_tanh8(v); },
      [](double x) { return 0.5 * x * (1.0 + std::tanh(tanh_inner(x))); },
      [](double x) { return 0.5 * x; });
  EXPECT_LE(w.ulps, 3.0) << "at x = " << w.at;
  // 0.5 (1 + t) + 0.5 x (1 - t^2) u'(x), in ulps of its larger term
  auto grad = [](double x) {
    const double t = std::tanh(tanh_inner(x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * std::sqrt(2.0 / M_PI) * (1.0 + 3 * 0.044715 * x * x);
  };
  auto grad_scale = [](double x) {
    const double t = std::tanh(tanh_inner(x));
    return std::max(0.5 * (1.0 + std::fabs(t)), std::fabs(0.5 * x * (1.0 - t * t) * std::sqrt(2.0 / M_PI) * (1.0 + 3 * 0.044715 * x * x)));
  };
  const Worst d = worst_ulps(
      sweep(-10.0f, 30.0f, kPoints), [](f8 v) { return ember::cpu::vec8::gelu_tanh_grad8(v); }, grad, grad_scale);
  EXPECT_LE(d.ulps, 4.0) << "at x = " << d.at;
}

TEST(LaneMath, GeluKernelRunsTheLaneFormula) {
  // the f32 unary gelu kernel (8 or 16 lanes) gives the header's results bit for bit
  const std::vector<float> xs = sweep(-14.0f, 14.0f, 1 << 16);
  const std::vector<float> got = ember::gelu(ember::from_vector<float>(xs)).to_vector<float>();
  ASSERT_EQ(got.size(), xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(ember::cpu::vec8::gelu8(f8{} + xs[i])[0]))
        << "x = " << xs[i];
  }
}
