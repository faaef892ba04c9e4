// gather_every_other_avx512 (convolution_pointwise_gather.h): a stride-2 row's even columns
// sixteen at a time from two loads and one two-source permute, the row's tail under masks, where
// the AVX2 loop moves eight at a time and the tail one by one. On ResNet-18's 64->128 1x1
// stride-2 forward (N = 8, one thread) 108 GFLOP/s against 101 with the AVX2 loop.

#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/convolution_pointwise_gather.h"

#include "kernels/cpu/avx512_code_begin.inc"

namespace ember::cpu {
namespace {

__mmask16 first_lanes(int64_t n) { return __mmask16((1u << std::clamp<int64_t>(n, 0, 16)) - 1); }

}  // namespace

void gather_every_other_avx512(float* d, const float* s, int64_t n) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    const __m512 a = _mm512_loadu_ps(s + 2 * k), b = _mm512_maskz_loadu_ps(0x7fff, s + 2 * k + 16);
    _mm512_storeu_ps(d + k, _mm512_permutex2var_ps(a, even, b));
  }
  if (k < n) {
    const int64_t m = n - k, reads = 2 * m - 1;
    const __m512 a = _mm512_maskz_loadu_ps(first_lanes(reads), s + 2 * k);
    const __m512 b = _mm512_maskz_loadu_ps(first_lanes(reads - 16), s + 2 * k + 16);
    _mm512_mask_storeu_ps(d + k, first_lanes(m), _mm512_permutex2var_ps(a, even, b));
  }
}

}  // namespace ember::cpu

#include "kernels/cpu/avx512_code_end.inc"
