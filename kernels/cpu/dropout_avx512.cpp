// The dropout keep bytes 16 Philox blocks at a time (kernels/cpu/dropout_mask.h): the rounds of
// Philox::draw with one block per 64-bit lane, the even and odd blocks' words merged once at the
// end, and each block's four keep bytes assembled in one 32-bit lane; dropout itself applies
// each 64 bytes to their 64 elements straight from registers. Everything after the target
// pragma is compiled for AVX-512 and has internal linkage but the entry points.
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/dropout_mask.h"

#include "kernels/cpu/avx512_code_begin.inc"

namespace ember::cpu {
namespace {

// Philox rounds on the even and the odd blocks of a 16-block step as two halves of 8 blocks,
// one block per 64-bit lane: a block's words sit in the low halves of its lanes, where
// _mm512_mul_epu32 reads them and leaves the full 64-bit products, so a round takes a multiply,
// a shuffle (the high word down) and a three-way xor per pair of words (the high halves hold
// garbage no multiply reads). The shuffle runs on the port the multiplies leave free, where a
// 64-bit shift would queue behind them on the other.
struct Keys {
  __m512i key0[10], key1[10];
  uint32_t first0[2], first1[2];  // rounds 0 and 1's key words, for first_two_rounds' constants
};

struct Half {
  __m512i c[4];
};

// Each 64-bit lane's high word in its low half (and the low word in the high half).
inline __m512i high_down(__m512i p) { return _mm512_shuffle_epi32(p, _MM_PERM_CDAB); }

constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;

// Rounds first_round .. 9.
template <int G>
inline void rounds(const Keys& k, Half (&h)[G], int first_round) {
  const __m512i mul0 = _mm512_set1_epi64(kMul0), mul1 = _mm512_set1_epi64(kMul1);
  for (int round = first_round; round < 10; ++round) {
    for (int g = 0; g < G; ++g) {
      const __m512i p0 = _mm512_mul_epu32(h[g].c[0], mul0), p1 = _mm512_mul_epu32(h[g].c[2], mul1);
      h[g].c[0] = _mm512_ternarylogic_epi32(high_down(p1), h[g].c[1], k.key0[round], 0x96);  // xor of 3
      h[g].c[2] = _mm512_ternarylogic_epi32(high_down(p0), h[g].c[3], k.key1[round], 0x96);
      h[g].c[1] = p1;
      h[g].c[3] = p0;
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

// Rounds 0 and 1 of the even and the odd halves of 16 blocks whose counter words are (lo[k], hi,
// 0, 0) in lane k, as a dropout draw's are where the low words do not carry: only word 0 varies,
// so round 0 has one product and a constant word 0, round 1 a constant product, and the two take
// 7 instructions a half instead of 12.
inline void first_two_rounds(const Keys& k, __m512i lo, uint32_t hi, Half& even, Half& odd) {
  const __m512i mul0 = _mm512_set1_epi64(kMul0), mul1 = _mm512_set1_epi64(kMul1);
  const uint64_t product = uint64_t(hi ^ k.first0[0]) * kMul0;  // round 1's of word 0 after round 0
  const __m512i word2_key = _mm512_set1_epi32(int(uint32_t(product >> 32) ^ k.first1[1]));
  const __m512i word3 = _mm512_set1_epi32(int(uint32_t(product)));
  auto half = [&](__m512i word0) {
    const __m512i p0 = _mm512_mul_epu32(word0, mul0);
    const __m512i word2 = _mm512_xor_si512(high_down(p0), k.key1[0]);  // words 1 and 3 were 0
    const __m512i p1 = _mm512_mul_epu32(word2, mul1);
    return Half{{_mm512_xor_si512(high_down(p1), k.key0[1]), p1, _mm512_xor_si512(p0, word2_key), word3}};
  };
  even = half(lo);
  odd = half(_mm512_srli_epi64(lo, 32));
}

// Where the elements go: the keep bytes alone (out and x unused), or also out = x * (keep ?
// scale : 0), with ordinary or non-temporal stores.
enum class Write { KeepBytes, Apply, ApplyStreamed };

// G steps of 16 blocks from block c on: their keep bytes at keep (64 per step), and under
// Write::Apply* elements x[0 .. 64 G) dropped into out.
template <int G, Write W>
inline void steps(const Keys& k, uint64_t c, __m512i bound, __m512 scale, uint8_t* keep, const float* x, float* out) {
  Half h[2 * G];
  bool carries = false;
  for (int g = 0; g < G; ++g) carries |= uint32_t(c + 16 * uint64_t(g)) > 0xFFFFFFFFu - 15u;
  if (!carries) {
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int g = 0; g < G; ++g) {
      const uint64_t first = c + 16 * uint64_t(g);
      first_two_rounds(k, _mm512_add_epi32(_mm512_set1_epi32(int(uint32_t(first))), iota), uint32_t(first >> 32),
                       h[2 * g], h[2 * g + 1]);
    }
    rounds(k, h, 2);
  } else {
    for (int g = 0; g < G; ++g) {
      __m512i lo, hi;
      counters(c + 16 * uint64_t(g), lo, hi);
      h[2 * g] = {{lo, hi, _mm512_setzero_si512(), _mm512_setzero_si512()}};  // even blocks in the low halves
      h[2 * g + 1] = {{_mm512_srli_epi64(lo, 32), _mm512_srli_epi64(hi, 32), _mm512_setzero_si512(),
                       _mm512_setzero_si512()}};
    }
    rounds(k, h, 0);
  }
  // 32-bit lane k of the merge: the word of block k, from lane k / 2 of the even (k even) or
  // the odd (k odd) blocks' half
  const __m512i merge = _mm512_setr_epi32(0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30);
  for (int g = 0; g < G; ++g) {
    // byte w of lane k keeps word w of block k: (word >> 8) >= threshold is word >= bound; each
    // word's bit is or-ed in under its compare's mask, one instruction where a zero-masked move
    // and an or take two
    auto kept_words = [&](int w) {
      return _mm512_cmpge_epu32_mask(_mm512_permutex2var_epi32(h[2 * g].c[w], merge, h[2 * g + 1].c[w]), bound);
    };
    __m512i bytes = _mm512_maskz_mov_epi32(kept_words(0), _mm512_set1_epi32(1));
    for (int w = 1; w < 4; ++w)
      bytes = _mm512_mask_or_epi32(bytes, kept_words(w), bytes, _mm512_set1_epi32(1 << (8 * w)));
    uint8_t* kg = keep + 64 * g;
    if constexpr (W == Write::ApplyStreamed) _mm512_stream_si512(reinterpret_cast<__m512i*>(kg), bytes);
    else _mm512_storeu_si512(kg, bytes);
    if constexpr (W != Write::KeepBytes) {
      // bit e of the mask keeps element e of the step; a dropped element is x * 0, so NaN and
      // inf stay visible
      const __mmask64 kept = _mm512_test_epi8_mask(bytes, bytes);
      for (int q = 0; q < 4; ++q) {
        const int64_t e = 64 * g + 16 * q;
        // x 4 KiB ahead, past the page the hardware prefetchers stop at (streamed runs are long)
        if constexpr (W == Write::ApplyStreamed) _mm_prefetch(reinterpret_cast<const char*>(x + e + 1024), _MM_HINT_T0);
        const __m512 y = _mm512_mul_ps(_mm512_loadu_ps(x + e), _mm512_maskz_mov_ps(__mmask16(kept >> (16 * q)), scale));
        if constexpr (W == Write::ApplyStreamed) _mm512_stream_ps(out + e, y);
        else _mm512_storeu_ps(out + e, y);
      }
    }
  }
}

Keys round_keys(uint64_t key) {
  Keys keys;
  uint32_t k0 = uint32_t(key), k1 = uint32_t(key >> 32);
  for (int round = 0; round < 10; ++round, k0 += 0x9E3779B9u, k1 += 0xBB67AE85u) {
    keys.key0[round] = _mm512_set1_epi32(int(k0));
    keys.key1[round] = _mm512_set1_epi32(int(k1));
    if (round < 2) {
      keys.first0[round] = k0;
      keys.first1[round] = k1;
    }
  }
  return keys;
}

// Blocks first .. first + count - 1 in steps of 16, two steps at a time (four independent chains
// of multiplies hide their latency); returns how many blocks it did.
template <Write W>
int64_t run_blocks(uint64_t key, uint64_t first, int64_t count, uint32_t threshold, float scale, const float* x,
                   float* out, uint8_t* keep) {
  const Keys keys = round_keys(key);
  const __m512i bound = _mm512_set1_epi32(int(threshold << 8));
  const __m512 s = _mm512_set1_ps(scale);
  // x and out are null where only keep bytes are written: no offset may be applied to them then
  auto at = [](auto* p, int64_t i) { return W == Write::KeepBytes ? p : p + i; };
  int64_t b = 0;
  for (; b + 32 <= count; b += 32)
    steps<2, W>(keys, first + uint64_t(b), bound, s, keep + 4 * b, at(x, 4 * b), at(out, 4 * b));
  for (; b + 16 <= count; b += 16)
    steps<1, W>(keys, first + uint64_t(b), bound, s, keep + 4 * b, at(x, 4 * b), at(out, 4 * b));
  return b;
}

}  // namespace

int64_t dropout_keep_blocks_avx512(uint64_t key, uint64_t first, int64_t count, uint32_t threshold, uint8_t* out) {
  if (threshold >= (1u << 24)) return 0;  // threshold << 8 would wrap
  return run_blocks<Write::KeepBytes>(key, first, count, threshold, 0.0f, nullptr, nullptr, out);
}

int64_t dropout_blocks_avx512(uint64_t key, uint64_t first, int64_t count, uint32_t threshold, float scale,
                              const float* x, float* out, uint8_t* keep, bool stream) {
  if (threshold >= (1u << 24)) return 0;
  if (stream && reinterpret_cast<uintptr_t>(out) % 64 == 0 && reinterpret_cast<uintptr_t>(keep) % 64 == 0) {
    const int64_t done = run_blocks<Write::ApplyStreamed>(key, first, count, threshold, scale, x, out, keep);
    _mm_sfence();  // the streamed stores before whatever tells another thread they are done
    return done;
  }
  return run_blocks<Write::Apply>(key, first, count, threshold, scale, x, out, keep);
}

}  // namespace ember::cpu

#include "kernels/cpu/avx512_code_end.inc"
