#include "kernels/cpu/convolution_pointwise_gather.h"

#include <algorithm>

#include "kernels/cpu/vec8.h"

namespace ember::cpu {
namespace {

// Output rows ahead of the one gathered whose input row is prefetched.
constexpr int64_t kPrefetchRows = 10;

// d[k] = s[2 * k] for k < n, reading s[0, 2n - 1) only: two vectors de-interleaved per 8.
void gather_every_other(float* d, const float* s, int64_t n) {
  using vec8::f8;
  int64_t k = 0;
  for (; k + 8 <= n && 2 * k + 16 <= 2 * n - 1; k += 8) {
    const f8 a = vec8::load8(s + 2 * k), b = vec8::load8(s + 2 * k + 8);
    vec8::store8(d + k, __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14));
  }
  for (; k < n; ++k) d[k] = s[2 * k];
}

}  // namespace

void gather_position_rows(const PointwiseGeometry& g, const float* x, int64_t c0, int64_t c1, float* xs, int64_t ld,
                          bool avx512) {
  const float* x_end = x + g.channels * g.height * g.width;
  const int64_t sh = g.p.stride[0], sw = g.p.stride[1], top = g.p.padding_begin[0], left = g.p.padding_begin[1];
  const int64_t lo = g.first_inside(), hi = g.end_inside();
  for (int64_t c = c0; c < c1; ++c) {
    float* out = xs + c * ld;
    for (int64_t oh = 0; oh < g.out_h; ++oh, out += g.out_w) {
      const int64_t ih = oh * sh - top;
      if (ih < 0 || ih >= g.height) {
        std::fill(out, out + g.out_w, 0.0f);
        continue;
      }
      const float* src = x + (c * g.height + ih) * g.width - left;
      // The input row kPrefetchRows output rows on (in this channel or the next).
      const float* ahead = x + (c * g.height + ih + kPrefetchRows * sh) * g.width;
      if (ahead + g.width <= x_end)
        for (int64_t k = 0; k < g.width; k += 16) __builtin_prefetch(ahead + k);
      std::fill(out, out + lo, 0.0f);
      if (sw == 2)  // the common stride
        (avx512 ? gather_every_other_avx512 : gather_every_other)(out + lo, src + 2 * lo, hi - lo);
      else
        for (int64_t ow = lo; ow < hi; ++ow) out[ow] = src[ow * sw];
      std::fill(out + hi, out + g.out_w, 0.0f);
    }
    std::fill(xs + c * ld + g.area(), xs + (c + 1) * ld, 0.0f);
  }
}

void prefetch_position_rows(const PointwiseGeometry& g, const float* x, int64_t part, int64_t parts) {
  const int64_t rows = g.channels * g.out_h;
  for (int64_t i = rows * part / parts; i < rows * (part + 1) / parts; ++i) {
    const int64_t c = i / g.out_h, ih = (i % g.out_h) * g.p.stride[0] - g.p.padding_begin[0];
    if (ih < 0 || ih >= g.height) continue;
    const float* row = x + (c * g.height + ih) * g.width;
    for (int64_t k = 0; k < g.width; k += 16) __builtin_prefetch(row + k, 0, 1);
  }
}

}  // namespace ember::cpu
