// The dropout keep bytes 16 Philox blocks at a time (kernels/cpu/dropout_mask.h): the rounds of
// Philox::draw on 16 lanes, the product halves merged with mask blends, and each block's four
// keep bytes assembled in one 32-bit lane. Everything after the target pragma is compiled for
// AVX-512 and has internal linkage but the one entry point.
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/dropout_mask.h"

#include "kernels/cpu/avx512_code_begin.inc"

namespace ember::cpu {
namespace {

// High and low 32-bit words of the 32x32-bit products of 16 lanes with m.
inline void mul_hi_lo(__m512i a, __m512i m, __m512i& hi, __m512i& lo) {
  const __m512i even = _mm512_mul_epu32(a, m);
  const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m);
  lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
  hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
}

}  // namespace

int64_t dropout_keep_blocks_avx512(uint64_t key, uint64_t first, int64_t count, uint32_t threshold, uint8_t* out) {
  __m512i key0[10], key1[10];
  uint32_t k0 = uint32_t(key), k1 = uint32_t(key >> 32);
  for (int round = 0; round < 10; ++round, k0 += 0x9E3779B9u, k1 += 0xBB67AE85u) {
    key0[round] = _mm512_set1_epi32(int(k0));
    key1[round] = _mm512_set1_epi32(int(k1));
  }
  const __m512i mul0 = _mm512_set1_epi64(0xD2511F53u), mul1 = _mm512_set1_epi64(0xCD9E8D57u);
  const __m512i below = _mm512_set1_epi32(int(threshold) - 1);  // 24-bit values: signed compare is exact
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  int64_t b = 0;
  for (; b + 16 <= count; b += 16) {
    const uint64_t c = first + uint64_t(b);
    __m512i c0, c1;
    if (uint32_t(c) <= 0xFFFFFFFFu - 15u) {  // the low words do not wrap within the 16
      c0 = _mm512_add_epi32(_mm512_set1_epi32(int(uint32_t(c))), iota);
      c1 = _mm512_set1_epi32(int(uint32_t(c >> 32)));
    } else {
      alignas(64) uint32_t lo[16], hi[16];
      for (int k = 0; k < 16; ++k) {
        lo[k] = uint32_t(c + uint64_t(k));
        hi[k] = uint32_t((c + uint64_t(k)) >> 32);
      }
      c0 = _mm512_load_si512(lo);
      c1 = _mm512_load_si512(hi);
    }
    __m512i c2 = _mm512_setzero_si512(), c3 = _mm512_setzero_si512();
    for (int round = 0; round < 10; ++round) {
      __m512i hi0, lo0, hi1, lo1;
      mul_hi_lo(c0, mul0, hi0, lo0);
      mul_hi_lo(c2, mul1, hi1, lo1);
      const __m512i n0 = _mm512_ternarylogic_epi32(hi1, c1, key0[round], 0x96);  // three-way xor
      const __m512i n2 = _mm512_ternarylogic_epi32(hi0, c3, key1[round], 0x96);
      c1 = lo1;
      c3 = lo0;
      c0 = n0;
      c2 = n2;
    }
    // byte w of lane k keeps word w of block c + k
    auto keep = [&](__m512i w, int shift) {
      return _mm512_maskz_mov_epi32(_mm512_cmpgt_epi32_mask(_mm512_srli_epi32(w, 8), below),
                                    _mm512_set1_epi32(1 << shift));
    };
    const __m512i bytes =
        _mm512_or_si512(_mm512_or_si512(keep(c0, 0), keep(c1, 8)), _mm512_or_si512(keep(c2, 16), keep(c3, 24)));
    _mm512_storeu_si512(out + 4 * b, bytes);
  }
  return b;
}

}  // namespace ember::cpu

#include "kernels/cpu/avx512_code_end.inc"
