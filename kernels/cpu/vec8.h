// 8-lane float vectors (GCC/Clang vector extensions) shared by the CPU kernels that need
// explicit lanes: float compares (max, clamps in exp) keep the auto-vectoriser away under
// -ftrapping-math, so those loops spell their lanes out. AVX2 width, the baseline build.
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX__)
#include <immintrin.h>
#endif

// Forces a lane helper into its caller: GCC's size heuristics otherwise keep the bigger ones
// (exp, the GELU formulas) out of line once they have many callers, and a call passes every
// vector through memory, which cost the exact GELU half its time.
#define EMBER_LANES_INLINE [[gnu::always_inline]] inline

namespace ember::cpu::vec8 {

using f8 = float __attribute__((vector_size(32)));
using u8 = uint32_t __attribute__((vector_size(32)));
using i8 = int32_t __attribute__((vector_size(32)));
constexpr int64_t kLanes = 8;

EMBER_LANES_INLINE f8 load8(const float* p) {
  f8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
EMBER_LANES_INLINE void store8(float* p, f8 v) { std::memcpy(p, &v, sizeof v); }
// The last n < 8 elements, padded with `fill`.
inline f8 load_tail(const float* p, int64_t n, float fill) {
  float buf[kLanes];
  for (int64_t k = 0; k < kLanes; ++k) buf[k] = k < n ? p[k] : fill;
  return load8(buf);
}
inline void store_tail(float* p, f8 v, int64_t n) {
  for (int64_t k = 0; k < n; ++k) p[k] = v[k];
}
// The lanes' sum in double, added as a tree: a row's reductions wait on this, so its latency
// (not its few instructions) is what a short row pays.
EMBER_LANES_INLINE double hsum(f8 v) {
  using d4 = double __attribute__((vector_size(32)));
  const d4 lo = __builtin_convertvector(__builtin_shufflevector(v, v, 0, 1, 2, 3), d4);
  const d4 hi = __builtin_convertvector(__builtin_shufflevector(v, v, 4, 5, 6, 7), d4);
  const d4 s = lo + hi;
  return (s[0] + s[2]) + (s[1] + s[3]);
}
// The largest lane, of lanes that hold no NaN.
EMBER_LANES_INLINE float hmax(f8 v) {
  const f8 a = __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3);
  const f8 m1 = a > v ? a : v;
  const f8 b = __builtin_shufflevector(m1, m1, 2, 3, 0, 1, 6, 7, 4, 5);
  const f8 m2 = b > m1 ? b : m1;
  const f8 c = __builtin_shufflevector(m2, m2, 1, 0, 3, 2, 5, 4, 7, 6);
  const f8 m3 = c > m2 ? c : m2;
  return m3[0];
}

// max(lo, x) and min(hi, x) as the max/min instructions take them: a NaN x comes back as is.
EMBER_LANES_INLINE f8 max_keep_nan(float lo, f8 x) {
#if defined(__AVX__)
  return std::bit_cast<f8>(_mm256_max_ps(_mm256_set1_ps(lo), std::bit_cast<__m256>(x)));
#else
  return x < lo ? f8{} + lo : x;
#endif
}
EMBER_LANES_INLINE f8 min_keep_nan(float hi, f8 x) {
#if defined(__AVX__)
  return std::bit_cast<f8>(_mm256_min_ps(_mm256_set1_ps(hi), std::bit_cast<__m256>(x)));
#else
  return x > hi ? f8{} + hi : x;
#endif
}

// a * b + c rounded once.
EMBER_LANES_INLINE f8 fma_lanes(f8 a, f8 b, f8 c) {
#if defined(__FMA__)
  return std::bit_cast<f8>(
      _mm256_fmadd_ps(std::bit_cast<__m256>(a), std::bit_cast<__m256>(b), std::bit_cast<__m256>(c)));
#else
  f8 r;
  for (int k = 0; k < kLanes; ++k) r[k] = std::fma(a[k], b[k], c[k]);
  return r;
#endif
}

// exp(x) = 2^n * exp(r), n = round(x / ln 2), |r| <= ln2 / 2, exp(r) = 1 + r + r^2 P(r) with P of
// degree 4 interpolating (e^r - 1 - r) / r^2 at Chebyshev nodes (0.16 ulp from exp(r) before
// rounding): within 1.5 ulp of exp in all (tests/ops/test_lane_math.cpp sweeps it), in 16 vector
// instructions, 10 of them multiplies or FMAs. x is clamped to [-88, 88] first; n = -127 then
// has 2^n's bits all zero, so x <= -87.68 (and -inf) gives exactly 0 with no compare at the end,
// and NaN stays NaN (the clamps keep it). The steps after the clamps are in
// kernels/cpu/exp_lanes.inc, which the 16-lane (AVX-512) kernels share.
using Lanes = f8;
using ULanes = u8;
#include "kernels/cpu/exp_lanes.inc"

// exp8's steps after the clamps, for x in [-88, 88] or NaN.
EMBER_LANES_INLINE f8 exp8_of_clamped(f8 x) { return exp_clamped_lanes(x); }

EMBER_LANES_INLINE f8 exp8(f8 x) { return exp8_of_clamped(min_keep_nan(88.0f, max_keep_nan(-88.0f, x))); }

// exp8(x) for x <= 0 or NaN (as softmax's x - max), bit for bit, without the upper clamp: one
// instruction and one constant register fewer in loops that are short of both.
EMBER_LANES_INLINE f8 exp8_nonpositive(f8 x) { return exp8_of_clamped(max_keep_nan(-88.0f, x)); }

}  // namespace ember::cpu::vec8
