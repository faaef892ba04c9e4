// The AVX2 random fills (kernels/cpu/random_lanes.h) against the scalar formulas of
// kernels/cpu/random_draws.h: the double lanes of log and cos(2 pi u) over every input the
// normal fill gives them (2^24 each), the fills bit for bit over odd starts, lengths and counters
// that carry into their high word, the public fills for each float type, and the normal's
// distribution (Kolmogorov-Smirnov).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/native/random.h"
#include "ember/ember.h"
#include "kernels/cpu/normal_lanes.h"
#include "kernels/cpu/random_draws.h"
#include "kernels/cpu/random_lanes.h"

namespace {

using namespace ember;

// Applies a lane function to xs four at a time.
template <typename F>
std::vector<double> on_lanes(const std::vector<double>& xs, F f) {
  std::vector<double> out(xs.size());
  for (size_t i = 0; i < xs.size(); i += 4) _mm256_storeu_pd(out.data() + i, f(_mm256_loadu_pd(xs.data() + i)));
  return out;
}

TEST(RandomLanes, LogIsWithinTwoToTheMinus50OfLibmOnEveryU1) {
  // u1 = (k + 1) / (2^24 + 1), k < 2^24: the fill's whole domain (all below 1)
  std::vector<double> u(size_t(1) << 24);
  for (size_t k = 0; k < u.size(); ++k) u[k] = (double(k) + 1.0) / 16777217.0;
  const std::vector<double> got = on_lanes(u, [](__m256d x) { return cpu::normal_lanes::log(x); });
  double worst = 0;
  for (size_t k = 0; k < u.size(); ++k) worst = std::max(worst, std::abs(got[k] - std::log(u[k])) / -std::log(u[k]));
  EXPECT_EQ(on_lanes({1.0, 1.0, 1.0, 1.0}, [](__m256d x) { return cpu::normal_lanes::log(x); })[0], 0.0);
  EXPECT_LT(worst, 0x1p-50) << std::log2(worst);
}

TEST(RandomLanes, CosIsWithinTwoToTheMinus48OfLibmOnEveryU2) {
  // u2 = k / 2^24; libm's cosine of the rounded angle, as the scalar fill takes it
  std::vector<double> u(size_t(1) << 24);
  for (size_t k = 0; k < u.size(); ++k) u[k] = double(k) * 0x1p-24;
  const std::vector<double> got = on_lanes(u, [](__m256d x) { return cpu::normal_lanes::cos_two_pi(x); });
  double worst = 0;
  for (size_t k = 0; k < u.size(); ++k) worst = std::max(worst, std::abs(got[k] - std::cos(6.283185307179586 * u[k])));
  EXPECT_LT(worst, 0x1p-48) << std::log2(worst);
  EXPECT_EQ(got[0], 1.0);
}

std::array<uint32_t, 4> draw(const GeneratorState& st, int64_t i) { return Philox::draw(st.seed, 0, st.offset + uint64_t(i)); }

TEST(RandomLanes, FillsGiveTheScalarBits) {
  // means far from zero put the sum's rounding where the lanes' last bits matter most
  for (uint64_t offset : {uint64_t(0), (uint64_t(1) << 32) - 37}) {
    for (auto [first, n] : {std::pair<int64_t, int64_t>{0, 1}, {3, 15}, {5, 17}, {0, 65}, {11, 200003}}) {
      for (auto [mean, std] : {std::pair<double, double>{0, 1}, {0.5, 0.02}, {-3, 7}, {1e4, 1e-3}, {2, -1}}) {
        SCOPED_TRACE("offset " + std::to_string(offset) + " first " + std::to_string(first) + " n " + std::to_string(n) +
                     " mean " + std::to_string(mean) + " std " + std::to_string(std));
        const GeneratorState st{77, offset};
        std::vector<float> normal(size_t(n) + 1, -1.0f), uniform(size_t(n) + 1, -1.0f);
        cpu::normal_fill_f32(normal.data(), st, first, n, mean, std);
        cpu::uniform_fill_f32(uniform.data(), st, first, n, mean, mean + std);
        int64_t normal_diff = 0, uniform_diff = 0;
        for (int64_t i = 0; i < n; ++i) {
          const auto r = draw(st, first + i);
          normal_diff += normal[size_t(i)] != float(cpu::normal_value(r, mean, std));
          uniform_diff += uniform[size_t(i)] != float(cpu::uniform_value(r, mean, mean + std));
        }
        EXPECT_EQ(normal_diff, 0);
        EXPECT_EQ(uniform_diff, 0);
        EXPECT_EQ(normal[size_t(n)], -1.0f);  // nothing written past n
        EXPECT_EQ(uniform[size_t(n)], -1.0f);
      }
    }
  }
}

TEST(RandomLanes, PublicFillsGiveTheScalarBitsForEachFloatType) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    const int64_t n = 40001;  // several threads' ranges and a ragged tail
    Generator g(5);
    Tensor normal = empty({n}, {dt}), uniform = empty({n}, {dt});
    native::random_fill(normal, native::RandomKind::Normal, 0.25, 2.0, g);
    const GeneratorState after_normal = g.get_state();
    native::random_fill(uniform, native::RandomKind::Uniform, -1.0, 3.0, g);
    const std::vector<float> got_normal = normal.to(DType::f32).to_vector<float>();
    const std::vector<float> got_uniform = uniform.to(DType::f32).to_vector<float>();
    Tensor want_normal = empty({n}), want_uniform = empty({n});
    float* wn = want_normal.data_ptr<float>();
    float* wu = want_uniform.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) {
      wn[i] = float(cpu::normal_value(draw({5, 0}, i), 0.25, 2.0));
      wu[i] = float(cpu::uniform_value(draw(after_normal, i), -1.0, 3.0));
    }
    EXPECT_EQ(got_normal, want_normal.to(dt).to(DType::f32).to_vector<float>());
    EXPECT_EQ(got_uniform, want_uniform.to(dt).to(DType::f32).to_vector<float>());
  }
}

TEST(RandomLanes, NormalFillPassesKolmogorovSmirnov) {
  manual_seed(2024);
  std::vector<float> x = randn({1 << 20}).to_vector<float>();
  std::sort(x.begin(), x.end());
  const double n = double(x.size());
  double d = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double cdf = 0.5 * std::erfc(-double(x[i]) / std::sqrt(2.0));
    d = std::max({d, cdf - double(i) / n, double(i + 1) / n - cdf});
  }
  EXPECT_LT(d, 1.63 / std::sqrt(n));  // the 1% critical value
}

}  // namespace
