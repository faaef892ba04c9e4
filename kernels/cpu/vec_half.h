// Loads and stores of 8 float lanes (vec8::f8) from and to every floating storage type, so one
// kernel body serves f32, bf16 and f16 data. bf16 is converted bitwise (a shift one way, round to
// nearest even the other, as core/half.h does element by element), f16 with the F16C
// instructions of the x86-64-v3 baseline. Without AVX2 the same functions fall back to scalar
// conversions.
#pragma once
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

#include "core/half.h"
#include "kernels/cpu/vec8.h"

namespace ember::cpu::vec8 {

inline f8 load8(const BFloat16* p) {
#if defined(__AVX2__)
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return std::bit_cast<f8>(_mm256_slli_epi32(wide, 16));
#else
  f8 v;
  for (int k = 0; k < kLanes; ++k) v[k] = float(p[k]);
  return v;
#endif
}

#if defined(__AVX2__)
// The bf16 bits of 8 floats, in the low halves of 32-bit lanes: rounded to nearest even, NaN kept
// a (quiet) NaN, as BFloat16::from_float. NaN is found by an unordered compare (one instruction
// where the exponent and mantissa tests took three).
inline __m256i bf16_bits(f8 v) {
  const __m256 f = std::bit_cast<__m256>(v);
  const __m256i u = _mm256_castps_si256(f);
  const __m256i high = _mm256_srli_epi32(u, 16);
  const __m256i bias = _mm256_add_epi32(_mm256_and_si256(high, _mm256_set1_epi32(1)), _mm256_set1_epi32(0x7fff));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
  const __m256i quiet = _mm256_or_si256(high, _mm256_set1_epi32(0x40));
  const __m256 nan = _mm256_cmp_ps(f, f, _CMP_UNORD_Q);
  return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(rounded), _mm256_castsi256_ps(quiet), nan));
}
#endif

inline void store8(BFloat16* p, f8 v) {
#if defined(__AVX2__)
  const __m256i r = bf16_bits(v);
  const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
#else
  for (int k = 0; k < kLanes; ++k) p[k] = BFloat16(v[k]);
#endif
}

inline f8 load8(const Half* p) {
#if defined(__F16C__)
  return std::bit_cast<f8>(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#else
  f8 v;
  for (int k = 0; k < kLanes; ++k) v[k] = float(p[k]);
  return v;
#endif
}

inline void store8(Half* p, f8 v) {
#if defined(__F16C__)
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm256_cvtps_ph(std::bit_cast<__m256>(v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#else
  for (int k = 0; k < kLanes; ++k) p[k] = Half(v[k]);
#endif
}

// The first n < 8 elements, the other lanes set to `fill`.
template <typename T>
inline f8 load_part(const T* p, int64_t n, float fill) {
  float buf[kLanes];
  for (int64_t k = 0; k < kLanes; ++k) buf[k] = k < n ? float(p[k]) : fill;
  return load8(buf);
}

template <typename T>
inline void store_part(T* p, f8 v, int64_t n) {
  for (int64_t k = 0; k < n; ++k) p[k] = T(v[k]);
}

// Widens (or narrows) n contiguous elements: dst[i] = To(float(src[i])).
template <typename To, typename From>
inline void convert_row(To* dst, const From* src, int64_t n) {
  int64_t i = 0;
#if defined(__AVX2__)
  if constexpr (std::is_same_v<To, BFloat16>) {
    // 16 elements a step: one pack and one 32-byte store for two vectors of bits
    for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
      const __m256i packed = _mm256_packus_epi32(bf16_bits(load8(src + i)), bf16_bits(load8(src + i + kLanes)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_permute4x64_epi64(packed, 0xD8));
    }
  }
#endif
  for (; i + kLanes <= n; i += kLanes) store8(dst + i, load8(src + i));
  if (i < n) store_part(dst + i, load_part(src + i, n - i, 0.0f), n - i);
}

}  // namespace ember::cpu::vec8
