// Philox4x32-10 (core/philox_rounds.h) on AVX2 registers, one block per 64-bit lane.
//
// _mm256_mul_epu32 multiplies the low 32 bits of each 64-bit lane into the whole lane, so with
// every state word in a lane's low half the product's low word is already in place and its high
// word is one shift away: no blends. The upper halves carry junk that no step reads (the
// multiply ignores them, the shift replaces them). A 64-bit lane also holds a whole counter, so
// counters carry into their high word by a plain 64-bit add.
//
// Several groups run side by side: one group's round is a chain of dependent multiply, shift
// and xors, and the independent groups fill the pipes while it waits.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace ember::cpu::philox_avx2 {

struct RoundKeys {
  __m256i k0[10], k1[10];
  explicit RoundKeys(uint64_t key) {
    uint32_t w0 = uint32_t(key), w1 = uint32_t(key >> 32);
    for (int round = 0; round < 10; ++round, w0 += 0x9E3779B9u, w1 += 0xBB67AE85u) {
      k0[round] = _mm256_set1_epi64x(int64_t(w0));
      k1[round] = _mm256_set1_epi64x(int64_t(w1));
    }
  }
};

// The four output words of four blocks: word w of the block in lane k is the low half of lane k
// of w[w].
struct Words {
  __m256i w[4];
};

// The Philox words of the blocks whose 64-bit counters are the lanes of counter[g], for each of
// the G groups (counter high word zero, as in Philox::draw(key, 0, c)).
template <int G>
inline void rounds(const RoundKeys& keys, const __m256i (&counter)[G], Words (&out)[G]) {
  const __m256i mul0 = _mm256_set1_epi64x(0xD2511F53), mul1 = _mm256_set1_epi64x(0xCD9E8D57);
  __m256i c0[G], c1[G], c2[G], c3[G];
  for (int g = 0; g < G; ++g) {
    c0[g] = counter[g];
    c1[g] = _mm256_srli_epi64(counter[g], 32);
    c2[g] = _mm256_setzero_si256();
    c3[g] = _mm256_setzero_si256();
  }
#pragma GCC unroll 10
  for (int round = 0; round < 10; ++round) {
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      const __m256i p0 = _mm256_mul_epu32(c0[g], mul0), p1 = _mm256_mul_epu32(c2[g], mul1);
      c0[g] = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p1, 32), c1[g]), keys.k0[round]);
      c2[g] = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p0, 32), c3[g]), keys.k1[round]);
      c1[g] = p1;
      c3[g] = p0;
    }
  }
  for (int g = 0; g < G; ++g) out[g] = Words{{c0[g], c1[g], c2[g], c3[g]}};
}

}  // namespace ember::cpu::philox_avx2
