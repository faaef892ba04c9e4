// The float32 normal and uniform fills 16 elements at a time: 16 Philox blocks on AVX2
// (kernels/cpu/philox_avx2.h), their words as doubles, and for the normal, Box-Muller on the
// double lanes of kernels/cpu/normal_lanes.h. Those differ from libm's log and cos by a few units
// in a double's last place, far below a float's; a result whose float could still depend on that
// difference (one within the margin of a float rounding boundary, about one in 2^17) is
// recomputed by the scalar formula, so every bit is the scalar fill's.
#include "kernels/cpu/random_lanes.h"

#if defined(__AVX2__)
#include <immintrin.h>

#include "kernels/cpu/normal_lanes.h"
#include "kernels/cpu/philox_avx2.h"
#include "kernels/cpu/random_draws.h"
#endif

#if defined(__AVX2__)
namespace ember::cpu {
namespace {

constexpr int kGroups = 4;  // 16 elements per step
// Bound on |lane normal - libm normal| as a fraction of the Box-Muller radius: the lanes stay
// within 2^-47 of libm over every input (tests/ops/test_random_lanes.cpp); 32 times that.
constexpr double kMargin = 0x1p-42;

// (w >> 8) of each lane's low word, as a double.
inline __m256d top24(__m256i w) {
  const __m256i v = _mm256_srli_epi64(_mm256_and_si256(w, _mm256_set1_epi64x(0xFFFFFF00)), 8);
  return _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(v, _mm256_set1_epi64x(0x4330000000000000))),
                       _mm256_set1_pd(0x1p52));
}

// Calls step(words, i) with the Philox words of elements first + i .. first + i + 3, for i a
// multiple of 4 below n rounded down to 16; returns that rounded n.
template <typename Step>
int64_t for_each_draw(const GeneratorState& st, int64_t first, int64_t n, Step step) {
  const philox_avx2::RoundKeys keys(st.seed);
  int64_t i = 0;
  for (; i + 4 * kGroups <= n; i += 4 * kGroups) {
    const __m256i base = _mm256_add_epi64(_mm256_set1_epi64x(int64_t(st.offset + uint64_t(first + i))),
                                          _mm256_setr_epi64x(0, 1, 2, 3));
    __m256i counter[kGroups];
    for (int g = 0; g < kGroups; ++g) counter[g] = _mm256_add_epi64(base, _mm256_set1_epi64x(4 * g));
    philox_avx2::Words words[kGroups];
    philox_avx2::rounds(keys, counter, words);
    for (int g = 0; g < kGroups; ++g) step(words[g], i + 4 * g);
  }
  return i;
}

inline std::array<uint32_t, 4> draw(const GeneratorState& st, int64_t element) {
  return Philox::draw(st.seed, 0, st.offset + uint64_t(element));
}

}  // namespace

void normal_fill_f32(float* out, const GeneratorState& st, int64_t first, int64_t n, double mean, double std) {
  const __m256d mean_v = _mm256_set1_pd(mean), std_v = _mm256_set1_pd(std);
  int64_t i = for_each_draw(st, first, n, [&](const philox_avx2::Words& w, int64_t at) {
    const __m256d u1 = _mm256_div_pd(_mm256_add_pd(top24(w.w[0]), _mm256_set1_pd(1.0)), _mm256_set1_pd(16777217.0));
    const __m256d u2 = _mm256_mul_pd(top24(w.w[1]), _mm256_set1_pd(0x1p-24));
    const __m256d radius = _mm256_sqrt_pd(_mm256_mul_pd(_mm256_set1_pd(-2.0), normal_lanes::log(u1)));
    const __m256d normal = _mm256_mul_pd(radius, normal_lanes::cos_two_pi(u2));
    _mm_storeu_ps(out + at, _mm256_cvtpd_ps(_mm256_fmadd_pd(std_v, normal, mean_v)));
    // the floats at both ends of the margin agree: libm's normal, inside it, gives the same one
    const __m256d delta = _mm256_mul_pd(radius, _mm256_set1_pd(kMargin));
    const __m128 low = _mm256_cvtpd_ps(_mm256_fmadd_pd(std_v, _mm256_sub_pd(normal, delta), mean_v));
    const __m128 high = _mm256_cvtpd_ps(_mm256_fmadd_pd(std_v, _mm256_add_pd(normal, delta), mean_v));
    const int sure = _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(_mm_castps_si128(low), _mm_castps_si128(high))));
    if (sure != 0xF) {
      for (int k = 0; k < 4; ++k) {
        if (!(sure >> k & 1)) out[at + k] = float(normal_value(draw(st, first + at + k), mean, std));
      }
    }
  });
  for (; i < n; ++i) out[i] = float(normal_value(draw(st, first + i), mean, std));
}

void uniform_fill_f32(float* out, const GeneratorState& st, int64_t first, int64_t n, double a, double b) {
  const __m256d a_v = _mm256_set1_pd(a), width = _mm256_set1_pd(b - a);
  int64_t i = for_each_draw(st, first, n, [&](const philox_avx2::Words& w, int64_t at) {
    const __m256d u = _mm256_mul_pd(top24(w.w[0]), _mm256_set1_pd(0x1p-24));
    _mm_storeu_ps(out + at, _mm256_cvtpd_ps(_mm256_fmadd_pd(width, u, a_v)));
  });
  for (; i < n; ++i) out[i] = float(uniform_value(draw(st, first + i), a, b));
}

}  // namespace ember::cpu
#endif
