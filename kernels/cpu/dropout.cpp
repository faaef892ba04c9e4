// CPU dropout. Element i keeps when the Philox uniform of counter (offset + i) is >= p, so the
// mask depends only on the generator state, never on how the range is split across threads.
// Dropped elements are multiplied by zero (not overwritten), so NaN and inf still show, as in
// PyTorch.
#include <cmath>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "core/native/nn_functional.h"
#include "core/parallel.h"
#include "core/type_dispatch.h"

namespace ember {
namespace {

constexpr int64_t kBlock = 2048;  // draw, mask and apply in cache-sized blocks

#if defined(__AVX2__)
// High and low 32-bit words of the 32x32-bit products of 8 lanes with m.
inline void mul_hi_lo(__m256i a, __m256i m, __m256i& hi, __m256i& lo) {
  const __m256i even = _mm256_mul_epu32(a, m);
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);
  lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}
#endif

// out[i] = word 0 of Philox::draw(key, 0, first + i) for i < n. The AVX2 path runs the same
// Philox4x32-10 rounds on 8 counters at once (about 2.5x faster); the tests compare its masks
// with the reference, which calls Philox::draw itself.
void philox_word0(uint64_t key, uint64_t first, int64_t n, uint32_t* out) {
  int64_t i = 0;
#if defined(__AVX2__)
  const __m256i mul0 = _mm256_set1_epi64x(0xD2511F53u), mul1 = _mm256_set1_epi64x(0xCD9E8D57u);
  for (; i + 8 <= n; i += 8) {
    alignas(32) uint32_t lo[8], hi[8];
    for (int k = 0; k < 8; ++k) {
      const uint64_t counter = first + uint64_t(i + k);
      lo[k] = uint32_t(counter);
      hi[k] = uint32_t(counter >> 32);
    }
    __m256i c0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(lo));
    __m256i c1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(hi));
    __m256i c2 = _mm256_setzero_si256(), c3 = _mm256_setzero_si256();
    uint32_t k0 = uint32_t(key), k1 = uint32_t(key >> 32);
    for (int round = 0; round < 10; ++round) {
      __m256i hi0, lo0, hi1, lo1;
      mul_hi_lo(c0, mul0, hi0, lo0);
      mul_hi_lo(c2, mul1, hi1, lo1);
      const __m256i n0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32(int(k0)));
      const __m256i n2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32(int(k1)));
      c1 = lo1;
      c3 = lo0;
      c0 = n0;
      c2 = n2;
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), c0);
  }
#endif
  for (; i < n; ++i) out[i] = Philox::draw(key, 0, first + uint64_t(i))[0];
}

void dropout_cpu(const Tensor& out, const Tensor& mask, const Tensor& x, double p, double scale, GeneratorState st) {
  // Philox::to_uniform(w) = (w >> 8) / 2^24 exactly, so "uniform >= p" is an integer compare.
  const uint32_t threshold = uint32_t(std::ceil(p * 16777216.0));
  visit_floating(x.dtype(), "dropout", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const T* in = x.data_ptr<T>();
    T* o = out.data_ptr<T>();
    bool* m = mask.data_ptr<bool>();
    const A s = A(scale);
    parallel_for(0, x.numel(), 16384, [&](int64_t begin, int64_t end) {
      uint32_t words[kBlock];
      for (int64_t b = begin; b < end; b += kBlock) {
        const int64_t n = std::min(end - b, kBlock);
        philox_word0(st.seed, st.offset + uint64_t(b), n, words);
        for (int64_t i = 0; i < n; ++i) m[b + i] = (words[i] >> 8) >= threshold;
        for (int64_t i = b; i < b + n; ++i) o[i] = T(A(in[i]) * (m[i] ? s : A(0)));
      }
    });
  });
}

void dropout_backward_cpu(const Tensor& grad_in, const Tensor& grad_out, const Tensor& mask, double scale) {
  visit_floating(grad_out.dtype(), "dropout_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const T* g = grad_out.data_ptr<T>();
    const bool* m = mask.data_ptr<bool>();
    T* o = grad_in.data_ptr<T>();
    const A s = A(scale);
    parallel_for(0, grad_out.numel(), 32768, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) o[i] = T(A(g[i]) * (m[i] ? s : A(0)));
    });
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::dropout_stub, CPU, &dropout_cpu);
EMBER_REGISTER_KERNEL(native::dropout_backward_stub, CPU, &dropout_backward_cpu);

}  // namespace ember
