// CPU dropout and the mask stream of kernels/cpu/dropout_mask.h.
//
// Each Philox4x32-10 block yields four 32-bit words and each word decides one element, so a
// mask of n elements runs n / 4 blocks; the AVX2 path runs 8 blocks side by side, the AVX-512
// one (kernels/cpu/dropout_avx512.cpp) 16, each writing its keep bytes directly. Work is split
// across threads by element ranges and every element's word depends only on its position, so
// masks never depend on the thread count. The mask is stored one byte per element (bool) and
// both passes run 8 float lanes at a time (bf16 and f16 converted on the fly).
#include <algorithm>
#include <cmath>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "core/cpu_features.h"
#include "core/native/nn_functional.h"
#include "core/parallel.h"
#include "core/type_dispatch.h"
#include "kernels/cpu/dropout_mask.h"
#include "kernels/cpu/vec_half.h"

namespace ember {
namespace {
constexpr int64_t kBlock = 2048;  // elements drawn, masked and applied at a time (cache-sized)
}  // namespace

namespace cpu {
namespace {

#if defined(__AVX2__)
// High and low 32-bit words of the 32x32-bit products of 8 lanes with m.
inline void mul_hi_lo(__m256i a, __m256i m, __m256i& hi, __m256i& lo) {
  const __m256i even = _mm256_mul_epu32(a, m);
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);
  lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}

// The keep bytes of the 8 blocks first .. first + 7: out[4 k + w] decides word w of block
// first + k. The rounds of Philox::draw on 8 lanes; round keys precomputed by the caller.
inline void keep8(uint64_t first, const __m256i* key0, const __m256i* key1, __m256i below, uint8_t* out) {
  const __m256i mul0 = _mm256_set1_epi64x(0xD2511F53u), mul1 = _mm256_set1_epi64x(0xCD9E8D57u);
  __m256i c0, c1;
  if (uint32_t(first) <= 0xFFFFFFFFu - 7u) {  // the low words do not wrap within the 8
    c0 = _mm256_add_epi32(_mm256_set1_epi32(int(uint32_t(first))), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    c1 = _mm256_set1_epi32(int(uint32_t(first >> 32)));
  } else {
    alignas(32) uint32_t lo[8], hi[8];
    for (int k = 0; k < 8; ++k) {
      lo[k] = uint32_t(first + uint64_t(k));
      hi[k] = uint32_t((first + uint64_t(k)) >> 32);
    }
    c0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(lo));
    c1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(hi));
  }
  __m256i c2 = _mm256_setzero_si256(), c3 = _mm256_setzero_si256();
  for (int round = 0; round < 10; ++round) {
    __m256i hi0, lo0, hi1, lo1;
    mul_hi_lo(c0, mul0, hi0, lo0);
    mul_hi_lo(c2, mul1, hi1, lo1);
    const __m256i n0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), key0[round]);
    const __m256i n2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), key1[round]);
    c1 = lo1;
    c3 = lo0;
    c0 = n0;
    c2 = n2;
  }
  // keep = (word >> 8) >= threshold (24-bit values: the signed compare is exact); byte w of
  // lane k is word w of block k
  const __m256i one = _mm256_set1_epi32(1);
  auto keep = [&](__m256i c) { return _mm256_and_si256(_mm256_cmpgt_epi32(_mm256_srli_epi32(c, 8), below), one); };
  const __m256i bytes =
      _mm256_or_si256(_mm256_or_si256(keep(c0), _mm256_slli_epi32(keep(c1), 8)),
                      _mm256_or_si256(_mm256_slli_epi32(keep(c2), 16), _mm256_slli_epi32(keep(c3), 24)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), bytes);
}
#endif

// Keep byte of one element, straight from Philox::draw.
inline uint8_t keep_one(const GeneratorState& st, uint32_t threshold, int64_t e) {
  const uint32_t w = Philox::draw(st.seed, 0, st.offset + uint64_t(e / 4))[size_t(e % 4)];
  return (w >> 8) >= threshold ? 1 : 0;
}

// The keep bytes of whole blocks first .. first + count - 1 (4 per block, in block order).
void keep_blocks(uint64_t key, uint64_t first, int64_t count, uint32_t threshold, uint8_t* out) {
  int64_t b = 0;
  if (cpu_capability() == CpuCapability::Avx512) b = dropout_keep_blocks_avx512(key, first, count, threshold, out);
#if defined(__AVX2__)
  if (b + 8 <= count) {
    __m256i key0[10], key1[10];
    uint32_t k0 = uint32_t(key), k1 = uint32_t(key >> 32);
    for (int round = 0; round < 10; ++round, k0 += 0x9E3779B9u, k1 += 0xBB67AE85u) {
      key0[round] = _mm256_set1_epi32(int(k0));
      key1[round] = _mm256_set1_epi32(int(k1));
    }
    const __m256i below = _mm256_set1_epi32(int(threshold) - 1);
    for (; b + 8 <= count; b += 8) keep8(first + uint64_t(b), key0, key1, below, out + 4 * b);
  }
#endif
  for (; b < count; ++b) {
    const auto w = Philox::draw(key, 0, first + uint64_t(b));
    for (int k = 0; k < 4; ++k) out[4 * b + k] = (w[size_t(k)] >> 8) >= threshold ? 1 : 0;
  }
}

}  // namespace

uint32_t dropout_threshold(double p) { return uint32_t(std::ceil(p * 16777216.0)); }

void dropout_keep_mask(const GeneratorState& st, uint32_t threshold, int64_t first, int64_t n, uint8_t* keep) {
  // elements before the first whole block, the whole blocks, the elements after the last
  for (; n > 0 && first % 4 != 0; ++first, ++keep, --n) *keep = keep_one(st, threshold, first);
  const int64_t blocks = n / 4;
  keep_blocks(st.seed, st.offset + uint64_t(first / 4), blocks, threshold, keep);
  first += 4 * blocks;
  keep += 4 * blocks;
  n -= 4 * blocks;
  for (; n > 0; ++first, ++keep, --n) *keep = keep_one(st, threshold, first);
}

void apply_keep_mask(float* out, const float* x, const uint8_t* keep, float scale, int64_t n) {
  using namespace vec8;
  int64_t i = 0;
#if defined(__AVX2__)
  const f8 s = f8{} + scale;
  for (; i + kLanes <= n; i += kLanes) {
    const __m256i k = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(keep + i)));
    const i8 kept = std::bit_cast<i8>(k) != 0;
    store8(out + i, load8(x + i) * (kept ? s : f8{}));
  }
#endif
  for (; i < n; ++i) out[i] = x[i] * (keep[i] ? scale : 0.0f);
}

}  // namespace cpu

namespace {

// out[i] = x[i] * (keep[i] ? scale : 0) for T data, computed in float (or double for f64).
template <typename T>
void apply_keep_typed(T* out, const T* x, const uint8_t* keep, acc_t<T> scale, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    cpu::apply_keep_mask(out, x, keep, scale, n);
  } else if constexpr (std::is_same_v<T, double>) {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * (keep[i] ? scale : 0.0);
  } else {
    float buf[kBlock];
    for (int64_t b = 0; b < n; b += kBlock) {
      const int64_t len = std::min(kBlock, n - b);
      cpu::vec8::convert_row(buf, x + b, len);
      cpu::apply_keep_mask(buf, buf, keep + b, scale, len);
      cpu::vec8::convert_row(out + b, buf, len);
    }
  }
}

void dropout_cpu(const Tensor& out, const Tensor& mask, const Tensor& x, double p, double scale, GeneratorState st) {
  const uint32_t threshold = cpu::dropout_threshold(p);
  uint8_t* m = reinterpret_cast<uint8_t*>(mask.data_ptr<bool>());
  visit_floating(x.dtype(), "dropout", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* in = x.data_ptr<T>();
    T* o = out.data_ptr<T>();
    parallel_for(0, x.numel(), 16384, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; b += kBlock) {
        const int64_t n = std::min(end - b, kBlock);
        cpu::dropout_keep_mask(st, threshold, b, n, m + b);
        apply_keep_typed(o + b, in + b, m + b, acc_t<T>(scale), n);
      }
    });
  });
}

void dropout_backward_cpu(const Tensor& grad_in, const Tensor& grad_out, const Tensor& mask, double scale) {
  const uint8_t* m = reinterpret_cast<const uint8_t*>(mask.data_ptr<bool>());
  visit_floating(grad_out.dtype(), "dropout_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* g = grad_out.data_ptr<T>();
    T* o = grad_in.data_ptr<T>();
    parallel_for(0, grad_out.numel(), 32768,
                 [&](int64_t b, int64_t e) { apply_keep_typed(o + b, g + b, m + b, acc_t<T>(scale), e - b); });
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::dropout_stub, CPU, &dropout_cpu);
EMBER_REGISTER_KERNEL(native::dropout_backward_stub, CPU, &dropout_backward_cpu);

}  // namespace ember
