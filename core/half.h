// 16-bit float storage types. Arithmetic happens in float: convert, compute, convert back.
// Conversions from float round to nearest, ties to even, as IEEE 754 and PyTorch do.
#pragma once
#include <cstdint>
#include <cstring>
#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace ember {

inline uint32_t float_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  BFloat16(float f) : bits(from_float(f)) {}
  operator float() const { return bits_float(uint32_t(bits) << 16); }
  static uint16_t from_float(float f) {
    uint32_t u = float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
    return uint16_t(u >> 16);
  }
};

struct Half {
  uint16_t bits = 0;
  Half() = default;
  Half(float f) : bits(from_float(f)) {}
  operator float() const { return to_float(bits); }

  static float to_float(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);  // one instruction on x86-64-v3 and later
#endif
    const uint32_t sign = uint32_t(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf / nan
    if (exp == 0) {
      if (mant == 0) return bits_float(sign);
      // subnormal: value = mant * 2^-24
      float v = float(mant) * 5.9604644775390625e-8f;
      return sign ? -v : v;
    }
    return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
  }

  static uint16_t from_float(float f) {
#if defined(__F16C__)
    return uint16_t(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));  // round to nearest even
#endif
    const uint32_t u = float_bits(f);
    const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
    const uint32_t absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u) return uint16_t(sign | 0x7e00u);          // NaN
    if (absu >= 0x477ff000u) return uint16_t(sign | 0x7c00u);         // overflow to inf (>= 65520)
    if (absu < 0x38800000u) {                                         // below smallest normal 2^-14
      // subnormal or zero: scale to units of 2^-24 and round to nearest even
      const float a = bits_float(absu);
      const float scaled = a * 16777216.0f;  // exact: power-of-two scaling
      uint32_t q = uint32_t(scaled);
      const float rem = scaled - float(q);
      if (rem > 0.5f || (rem == 0.5f && (q & 1u))) ++q;
      return uint16_t(sign | q);
    }
    // normal: rebias exponent, round mantissa from 23 to 10 bits
    uint32_t v = absu - (112u << 23);
    v += 0xfffu + ((v >> 13) & 1u);
    return uint16_t(sign | (v >> 13));
  }
};

}  // namespace ember
