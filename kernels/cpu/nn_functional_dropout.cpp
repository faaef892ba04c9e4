// CPU dropout and the mask stream of kernels/cpu/dropout_mask.h.
//
// Each Philox4x32-10 block yields four 32-bit words and each word decides one element, so a
// mask of n elements runs n / 4 blocks; the AVX2 path runs 16 blocks side by side
// (kernels/cpu/philox_avx2.h) and the rest 4 at a time, the AVX-512
// one (kernels/cpu/dropout_avx512.cpp) 16, each writing its keep bytes directly. Work is split
// across threads by element ranges and every element's word depends only on its position, so
// masks never depend on the thread count. The mask is stored one byte per element (bool) and
// both passes run 8 float lanes at a time (bf16 and f16 converted on the fly), except f32
// dropout with AVX-512, which applies each 64 keep bytes as it makes them
// (cpu::dropout_blocks_avx512) and streams a large output past the caches.
#include <algorithm>
#include <cmath>
#include <type_traits>

#if defined(__AVX2__)
#include <immintrin.h>

#include "kernels/cpu/philox_avx2.h"
#endif

#include "core/cpu_features.h"
#include "core/native/nn_functional.h"
#include "core/parallel.h"
#include "core/type_dispatch.h"
#include "kernels/cpu/dropout_mask.h"
#include "kernels/cpu/streamed_output.h"
#include "kernels/cpu/vec_half.h"

namespace ember {
namespace {
constexpr int64_t kBlock = 2048;  // elements drawn, masked and applied at a time (cache-sized)
}  // namespace

namespace cpu {
namespace {

#if defined(__AVX2__)
// Byte w of 32-bit lane k keeps when word[w] of lane k, shifted right by 8, is >= the threshold
// (24-bit values: the signed compare with threshold - 1 is exact).
inline __m256i keep_bytes(const __m256i (&word)[4], __m256i below) {
  __m256i bytes = _mm256_setzero_si256();
  for (int w = 0; w < 4; ++w) {
    const __m256i keep = _mm256_cmpgt_epi32(_mm256_srli_epi32(word[w], 8), below);
    bytes = _mm256_or_si256(bytes, _mm256_and_si256(keep, _mm256_set1_epi32(1 << (8 * w))));
  }
  return bytes;
}

// The keep bytes of the 16 blocks first .. first + 15: out[4 k + w] decides word w of block
// first + k. Groups 0 and 1 hold the even and odd blocks of the first 8, so that shifting the odd
// group's words into the upper halves of the lanes puts all 8 in block order.
inline void keep16(uint64_t first, const philox_avx2::RoundKeys& keys, __m256i below, uint8_t* out) {
  const __m256i even = _mm256_setr_epi64x(0, 2, 4, 6), step = _mm256_set1_epi64x(1);
  const __m256i base = _mm256_add_epi64(_mm256_set1_epi64x(int64_t(first)), even);
  const __m256i counter[4] = {base, _mm256_add_epi64(base, step),
                              _mm256_add_epi64(base, _mm256_set1_epi64x(8)),
                              _mm256_add_epi64(base, _mm256_set1_epi64x(9))};
  philox_avx2::Words words[4];
  philox_avx2::rounds(keys, counter, words);
  for (int half = 0; half < 2; ++half) {
    // 32-bit lane k: word w of block 8 half + k
    __m256i word[4];
    for (int w = 0; w < 4; ++w)
      word[w] = _mm256_blend_epi32(words[2 * half].w[w], _mm256_slli_epi64(words[2 * half + 1].w[w], 32), 0xAA);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32 * half), keep_bytes(word, below));
  }
}

// keep16 for the 4 blocks first .. first + 3 (the tail of a row).
inline void keep4(uint64_t first, const philox_avx2::RoundKeys& keys, __m256i below, uint8_t* out) {
  const __m256i counter[1] = {_mm256_add_epi64(_mm256_set1_epi64x(int64_t(first)), _mm256_setr_epi64x(0, 1, 2, 3))};
  philox_avx2::Words words[1];
  philox_avx2::rounds(keys, counter, words);
  // the blocks' bytes sit in the even 32-bit lanes
  const __m256i bytes = _mm256_permutevar8x32_epi32(keep_bytes(words[0].w, below), _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(bytes));
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
  if (b + 4 <= count) {
    const philox_avx2::RoundKeys keys(key);
    const __m256i below = _mm256_set1_epi32(int(threshold) - 1);
    for (; b + 16 <= count; b += 16) keep16(first + uint64_t(b), keys, below, out + 4 * b);
    for (; b + 4 <= count; b += 4) keep4(first + uint64_t(b), keys, below, out + 4 * b);
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
    // the mask, then the elements, a cache-sized block at a time
    auto two_passes = [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; b += kBlock) {
        const int64_t n = std::min(end - b, kBlock);
        cpu::dropout_keep_mask(st, threshold, b, n, m + b);
        apply_keep_typed(o + b, in + b, m + b, acc_t<T>(scale), n);
      }
    };
    const bool fused = std::is_same_v<T, float> && cpu_capability() == CpuCapability::Avx512;
    const bool stream = cpu::stream_output(x.numel() * int64_t(sizeof(T)));
    parallel_for(0, x.numel(), 16384, [&](int64_t begin, int64_t end) {
      if constexpr (std::is_same_v<T, float>) {
        if (fused) {
          // elements up to a multiple of 64 (whole blocks, and 64-byte lines of out and the mask
          // for streaming), then whole blocks with the mask applied from registers
          const int64_t body = std::min(end, (begin + 63) / 64 * 64);
          two_passes(begin, body);
          const int64_t done = 4 * cpu::dropout_blocks_avx512(st.seed, st.offset + uint64_t(body / 4), (end - body) / 4,
                                                              threshold, float(scale), in + body, o + body, m + body,
                                                              stream);
          two_passes(body + done, end);
          return;
        }
      }
      two_passes(begin, end);
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
