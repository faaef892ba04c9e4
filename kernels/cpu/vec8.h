// 8-lane float vectors (GCC/Clang vector extensions) shared by the CPU kernels that need
// explicit lanes: float compares (max, clamps in exp) keep the auto-vectoriser away under
// -ftrapping-math, so those loops spell their lanes out. AVX2 width, the baseline build.
#pragma once
#include <bit>
#include <cstdint>
#include <cstring>

namespace ember::cpu::vec8 {

using f8 = float __attribute__((vector_size(32)));
using u8 = uint32_t __attribute__((vector_size(32)));
using i8 = int32_t __attribute__((vector_size(32)));
constexpr int64_t kLanes = 8;

inline f8 load8(const float* p) {
  f8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store8(float* p, f8 v) { std::memcpy(p, &v, sizeof v); }
// The last n < 8 elements, padded with `fill`.
inline f8 load_tail(const float* p, int64_t n, float fill) {
  float buf[kLanes];
  for (int64_t k = 0; k < kLanes; ++k) buf[k] = k < n ? p[k] : fill;
  return load8(buf);
}
inline void store_tail(float* p, f8 v, int64_t n) {
  for (int64_t k = 0; k < n; ++k) p[k] = v[k];
}
inline double hsum(f8 v) {
  double s = 0;
  for (int k = 0; k < kLanes; ++k) s += double(v[k]);
  return s;
}

// exp(x) = 2^n * exp(r), n = round(x / ln 2), |r| <= ln2 / 2, with a degree-6 polynomial for
// exp(r): about 1 ulp. Inputs below -87.3 give exactly 0 (so exp(-inf) = 0); NaN stays NaN.
inline f8 exp8(f8 x_in) {
  const f8 lo = f8{} - 87.3f, hi = f8{} + 88.0f;
  f8 x = x_in < lo ? lo : x_in;
  x = x > hi ? hi : x;
  // adding 1.5 * 2^23 rounds to an integer, which then sits in the low mantissa bits
  const f8 shifted = x * 1.44269504088896341f + 12582912.0f;
  const f8 n = shifted - 12582912.0f;
  f8 r = x - n * 0.693359375f;  // ln 2 in two parts, so the reduction is exact
  r = r - n * -2.12194440e-4f;
  f8 p = f8{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const f8 er = p * r * r + r + 1.0f;
  const u8 pow2 = (std::bit_cast<u8>(shifted) - 0x4B400000u + 127u) << 23;
  return x_in < lo ? f8{} : er * std::bit_cast<f8>(pow2);
}

}  // namespace ember::cpu::vec8
