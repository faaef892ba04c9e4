// stream_stride2_rows_avx512 (convolution_pointwise_spread.h). The stretch is walked in halves of
// eight floats (rows are whole halves, so a half never straddles two rows); each pair of halves
// takes its four values apiece under masks and spreads them to the even lanes of one zmm by a
// zero-masking permute, written as one whole line past the cache.

#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/convolution_pointwise_spread.h"

namespace ember::cpu {

bool stride2_rows_stream_whole_lines(const PointwiseGeometry& g, const float* dx, int64_t ih0, int64_t ih1) {
  return g.p.stride[1] == 2 && g.p.padding_begin[1] == 0 && g.width % 8 == 0 && (g.height * g.width) % 16 == 0 &&
         (ih0 * g.width) % 16 == 0 && (ih1 * g.width) % 16 == 0 && reinterpret_cast<uintptr_t>(dx) % 64 == 0;
}

}  // namespace ember::cpu

#include "kernels/cpu/avx512_code_begin.inc"

namespace ember::cpu {
namespace {

__mmask8 first_lanes(int64_t n) { return __mmask8((1u << std::clamp<int64_t>(n, 0, 4)) - 1); }

}  // namespace

void stream_stride2_rows_avx512(const PointwiseGeometry& g, const float* s, int64_t oh0, int64_t ih0, int64_t ih1,
                                float add, float* plane) {
  const int64_t sh = g.p.stride[0], top = g.p.padding_begin[0], width = g.width, hi = g.end_inside();
  const __m512i spread = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  const __m512 va = _mm512_set1_ps(add);
  // Row ih's values (null where no output row reads it), worked out once a row.
  const auto values_of = [&](int64_t ih) -> const float* {
    const int64_t oh = (ih + top) / sh;
    return (ih + top) % sh == 0 && oh < g.out_h ? s + (oh - oh0) * g.out_w : nullptr;
  };
  int64_t ih = ih0, iw = 0;
  const float* row = values_of(ih);
  // The four values of the next half (zero where the row reads none), then a step past it.
  const auto next_half = [&] {
    const __m128 v = row ? _mm_maskz_loadu_ps(first_lanes(hi - iw / 2), row + iw / 2) : _mm_setzero_ps();
    iw += 8;
    if (iw == width) {
      iw = 0;
      if (++ih < ih1) row = values_of(ih);
    }
    return v;
  };
  for (float* out = plane + ih0 * width; ih < ih1; out += 16) {
    const __m128 lo = next_half();
    const __m128 hi_half = next_half();
    const __m512 v = _mm512_castps256_ps512(_mm256_set_m128(hi_half, lo));
    _mm512_stream_ps(out, _mm512_add_ps(_mm512_maskz_permutexvar_ps(0x5555, spread, v), va));
  }
}

}  // namespace ember::cpu

#include "kernels/cpu/avx512_code_end.inc"
