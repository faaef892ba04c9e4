// The dropout keep bytes 16 Philox blocks at a time (kernels/cpu/dropout_mask.h): the rounds of
// Philox::draw with one block per 64-bit lane, the even and odd blocks' words merged once at the
// end, and each block's four keep bytes assembled in one 32-bit lane. Everything after the target pragma is compiled for
// AVX-512 and has internal linkage but the one entry point.
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/dropout_mask.h"

#include "kernels/cpu/avx512_code_begin.inc"

namespace ember::cpu {
namespace {

// Philox rounds on the even and the odd blocks of a 16-block step as two halves of 8 blocks,
// one block per 64-bit lane: a block's words sit in the low halves of its lanes, where
// _mm512_mul_epu32 reads them and leaves the full 64-bit products, so a round takes a multiply,
// a shift (the high word down) and a three-way xor per pair of words (the high halves hold
// garbage no multiply reads). That is 12 instructions a round for 16 blocks where splitting
// products into 32-bit lanes took 16.
struct Keys {
  __m512i key0[10], key1[10];
};

struct Half {
  __m512i c0, c1, c2, c3;
};

template <int G>
inline void rounds(const Keys& k, Half (&h)[G]) {
  const __m512i mul0 = _mm512_set1_epi64(0xD2511F53u), mul1 = _mm512_set1_epi64(0xCD9E8D57u);
  for (int round = 0; round < 10; ++round) {
    for (int g = 0; g < G; ++g) {
      const __m512i p0 = _mm512_mul_epu32(h[g].c0, mul0), p1 = _mm512_mul_epu32(h[g].c2, mul1);
      h[g].c0 = _mm512_ternarylogic_epi32(_mm512_srli_epi64(p1, 32), h[g].c1, k.key0[round], 0x96);  // xor of 3
      h[g].c2 = _mm512_ternarylogic_epi32(_mm512_srli_epi64(p0, 32), h[g].c3, k.key1[round], 0x96);
      h[g].c1 = p1;
      h[g].c3 = p0;
    }
  }
}

// The low and high counter words of blocks c .. c + 15 in 32-bit lanes (lane k: block c + k).
inline void counters(uint64_t c, __m512i& lo, __m512i& hi) {
  if (uint32_t(c) <= 0xFFFFFFFFu - 15u) {  // the low words do not wrap within the 16
    lo = _mm512_add_epi32(_mm512_set1_epi32(int(uint32_t(c))),
                          _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    hi = _mm512_set1_epi32(int(uint32_t(c >> 32)));
    return;
  }
  alignas(64) uint32_t l[16], h[16];
  for (int k = 0; k < 16; ++k) {
    l[k] = uint32_t(c + uint64_t(k));
    h[k] = uint32_t((c + uint64_t(k)) >> 32);
  }
  lo = _mm512_load_si512(l);
  hi = _mm512_load_si512(h);
}

// Lane k of the result: word of block k, from the even blocks' half and the odd blocks' half.
inline __m512i interleave(__m512i even, __m512i odd) {
  return _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
}

// G steps of 16 blocks from block c on: their keep bytes at out (64 per step).
template <int G>
inline void keep_steps(const Keys& k, uint64_t c, __m512i below, uint8_t* out) {
  Half h[2 * G];
  for (int g = 0; g < G; ++g) {
    __m512i lo, hi;
    counters(c + 16 * uint64_t(g), lo, hi);
    h[2 * g] = {lo, hi, _mm512_setzero_si512(), _mm512_setzero_si512()};  // even blocks in the low halves
    h[2 * g + 1] = {_mm512_srli_epi64(lo, 32), _mm512_srli_epi64(hi, 32), _mm512_setzero_si512(),
                    _mm512_setzero_si512()};
  }
  rounds(k, h);
  // byte w of lane k keeps word w of block k
  auto keep = [&](__m512i w, int shift) {
    return _mm512_maskz_mov_epi32(_mm512_cmpgt_epi32_mask(_mm512_srli_epi32(w, 8), below),
                                  _mm512_set1_epi32(1 << shift));
  };
  for (int g = 0; g < G; ++g) {
    const Half& e = h[2 * g];
    const Half& o = h[2 * g + 1];
    const __m512i bytes =
        _mm512_or_si512(_mm512_or_si512(keep(interleave(e.c0, o.c0), 0), keep(interleave(e.c1, o.c1), 8)),
                        _mm512_or_si512(keep(interleave(e.c2, o.c2), 16), keep(interleave(e.c3, o.c3), 24)));
    _mm512_storeu_si512(out + 64 * g, bytes);
  }
}

}  // namespace

int64_t dropout_keep_blocks_avx512(uint64_t key, uint64_t first, int64_t count, uint32_t threshold, uint8_t* out) {
  Keys keys;
  uint32_t k0 = uint32_t(key), k1 = uint32_t(key >> 32);
  for (int round = 0; round < 10; ++round, k0 += 0x9E3779B9u, k1 += 0xBB67AE85u) {
    keys.key0[round] = _mm512_set1_epi32(int(k0));
    keys.key1[round] = _mm512_set1_epi32(int(k1));
  }
  const __m512i below = _mm512_set1_epi32(int(threshold) - 1);  // 24-bit values: signed compare is exact
  int64_t b = 0;
  // two steps at a time: four independent chains of multiplies hide their latency
  for (; b + 32 <= count; b += 32) keep_steps<2>(keys, first + uint64_t(b), below, out + 4 * b);
  for (; b + 16 <= count; b += 16) keep_steps<1>(keys, first + uint64_t(b), below, out + 4 * b);
  return b;
}

}  // namespace ember::cpu

#include "kernels/cpu/avx512_code_end.inc"
