// Double-precision log and cos(2 pi u) on four AVX2 lanes, for the Box-Muller normal fill
// (kernels/cpu/random_lanes.cpp). Accurate to a few units in the last place over the inputs that
// fill gives them (tests/ops/test_random_lanes.cpp measures the whole input range): the fill
// rounds to float, which needs only the first 24 of the 53 bits, and checks each result's margin
// against the scalar libm formula before using it.
#pragma once
#include <immintrin.h>

#include <array>
#include <cstdint>

namespace ember::cpu::normal_lanes {

// log(x) for positive normal x. x = 2^e m with m in [sqrt(1/2), sqrt(2)); log m = 2 atanh(s)
// with s = (m - 1) / (m + 1), |s| <= 0.172, and atanh(s) = s (1 + s^2/3 + s^4/5 + ...), whose
// terms past s^18/19 are below 2^-55 of the sum.
inline __m256d log(__m256d x) {
  const __m256i bits = _mm256_castpd_si256(x);
  const __m256i mantissa = _mm256_set1_epi64x(0x000FFFFFFFFFFFFF), one = _mm256_set1_epi64x(0x3FF0000000000000);
  __m256d m = _mm256_castsi256_pd(_mm256_or_si256(_mm256_and_si256(bits, mantissa), one));  // [1, 2)
  // the biased exponent as a double: its bits under 2^52's, minus 2^52 and the bias
  const __m256i biased = _mm256_srli_epi64(bits, 52);
  __m256d e = _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(biased, _mm256_set1_epi64x(0x4330000000000000))),
                            _mm256_set1_pd(4503599627370496.0 + 1023.0));
  const __m256d big = _mm256_cmp_pd(m, _mm256_set1_pd(1.4142135623730951), _CMP_GT_OQ);
  m = _mm256_blendv_pd(m, _mm256_mul_pd(m, _mm256_set1_pd(0.5)), big);
  e = _mm256_add_pd(e, _mm256_and_pd(big, _mm256_set1_pd(1.0)));
  const __m256d f = _mm256_sub_pd(m, _mm256_set1_pd(1.0));  // exact
  const __m256d s = _mm256_div_pd(f, _mm256_add_pd(m, _mm256_set1_pd(1.0)));
  const __m256d z = _mm256_mul_pd(s, s);
  __m256d p = _mm256_set1_pd(1.0 / 19.0);
  for (int k = 8; k >= 0; --k) p = _mm256_fmadd_pd(p, z, _mm256_set1_pd(1.0 / double(2 * k + 1)));
  // e ln 2 in two parts: the high one has 21 trailing zero bits, so e * it is exact for |e| < 2^21
  const __m256d ln2_hi = _mm256_set1_pd(0.6931471803691238), ln2_lo = _mm256_set1_pd(1.9082149292705877e-10);
  const __m256d log_m = _mm256_mul_pd(_mm256_add_pd(s, s), p);
  return _mm256_add_pd(_mm256_mul_pd(e, ln2_hi), _mm256_fmadd_pd(e, ln2_lo, log_m));
}

// (-1)^k / (2k + odd)! for k = 0 .. 8; the factorials up to 17! are exact in double.
constexpr std::array<double, 9> taylor_coefficients(int odd) {
  std::array<double, 9> c{};
  double factorial = 1.0;
  for (int n = 1; n <= 2 * 8 + odd; ++n) {
    factorial *= double(n);
    if (n % 2 == odd) c[size_t(n / 2)] = ((n / 2) % 2 ? -1.0 : 1.0) / factorial;
  }
  c[0] = 1.0;
  return c;
}

// cos(2 pi u) for u in [0, 1) with at most 50 significant bits. u = q / 4 + r with q the nearest
// integer to 4 u, so r (in [-1/8, 1/8]) is exact and the angle 2 pi r is within pi / 4; the
// Taylor series of cos and sin there end below 2^-60 after the 16th and 17th powers.
inline __m256d cos_two_pi(__m256d u) {
  const __m256d q = _mm256_round_pd(_mm256_mul_pd(u, _mm256_set1_pd(4.0)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256d r = _mm256_fnmadd_pd(q, _mm256_set1_pd(0.25), u);
  const __m256d a = _mm256_mul_pd(r, _mm256_set1_pd(6.283185307179586));
  const __m256d t = _mm256_mul_pd(a, a);
  // cos a = sum (-1)^k t^k / (2k)!, sin a = a sum (-1)^k t^k / (2k + 1)!
  constexpr auto cos_c = taylor_coefficients(0), sin_c = taylor_coefficients(1);
  __m256d c = _mm256_set1_pd(cos_c[8]), s = _mm256_set1_pd(sin_c[8]);
  for (int k = 7; k >= 0; --k) {
    c = _mm256_fmadd_pd(c, t, _mm256_set1_pd(cos_c[k]));
    s = _mm256_fmadd_pd(s, t, _mm256_set1_pd(sin_c[k]));
  }
  s = _mm256_mul_pd(s, a);
  // cos(a + q pi/2): q mod 4 = 0 cos, 1 -sin, 2 -cos, 3 sin
  const __m256i qi = _mm256_castpd_si256(_mm256_add_pd(q, _mm256_set1_pd(4503599627370496.0)));  // q in the low bits
  const __m256d odd = _mm256_castsi256_pd(
      _mm256_cmpeq_epi64(_mm256_and_si256(qi, _mm256_set1_epi64x(1)), _mm256_set1_epi64x(1)));
  const __m256i sign = _mm256_slli_epi64(_mm256_and_si256(_mm256_add_epi64(qi, _mm256_set1_epi64x(1)),
                                                           _mm256_set1_epi64x(2)), 62);
  return _mm256_xor_pd(_mm256_blendv_pd(c, s, odd), _mm256_castsi256_pd(sign));
}

}  // namespace ember::cpu::normal_lanes
