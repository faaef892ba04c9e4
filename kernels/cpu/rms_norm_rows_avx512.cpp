// 16-lane twins of RMS norm's f32 row loops
// (kernels/cpu/rms_norm_rows_avx512.h).
#include "kernels/cpu/rms_norm_rows_avx512.h"

#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cpu/avx512_code_begin.inc"

namespace ember::cpu::rms_norm_rows {
namespace {

inline __m256 low(__m512 v) { return _mm512_castps512_ps256(v); }
inline __m256 high(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }

// norm_lanes::hsum of the 8-lane code's two sums: (p0 + p1), then (0 + 1) + (2
// + 3)
inline double hsum(__m512d both) {
  const __m256d s = _mm256_add_pd(_mm512_castpd512_pd256(both), _mm512_extractf64x4_pd(both, 1));
  alignas(32) double d[4];
  _mm256_store_pd(d, s);
  return (d[0] + d[1]) + (d[2] + d[3]);
}

// sums[r] += v w over 16 elements, widened: the low eight, then the high eight
// (the products of two floats are exact in double, so the FMA rounds as the
// 8-lane multiply and add do)
inline __m512d add_products(__m512d sum, __m512 v, __m512 w) {
  sum = _mm512_fmadd_pd(_mm512_cvtps_pd(low(v)), _mm512_cvtps_pd(low(w)), sum);
  return _mm512_fmadd_pd(_mm512_cvtps_pd(high(v)), _mm512_cvtps_pd(high(w)), sum);
}

template <int R>
void sum_squares(double *out, const float *x, int64_t n) {
  __m512d sums[R];
  for (int r = 0; r < R; ++r) sums[r] = _mm512_setzero_pd();
  for (int64_t i = 0; i < n; i += 16)
    for (int r = 0; r < R; ++r) {
      const __m512 v = _mm512_loadu_ps(x + r * n + i);
      sums[r] = add_products(sums[r], v, v);
    }
  for (int r = 0; r < R; ++r) out[r] = hsum(sums[r]);
}

template <int R, bool kW>
void weighted_dots(double *out, const float *dy, const float *x, const float *w, int64_t n) {
  __m512d sums[R];
  for (int r = 0; r < R; ++r) sums[r] = _mm512_setzero_pd();
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 wv = kW ? _mm512_loadu_ps(w + i) : _mm512_setzero_ps();
    for (int r = 0; r < R; ++r) {
      const __m512 g = _mm512_loadu_ps(dy + r * n + i);
      sums[r] = add_products(sums[r], kW ? _mm512_mul_ps(g, wv) : g, _mm512_loadu_ps(x + r * n + i));
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(sums[r]);
}

template <int R, bool kW, bool kDx, bool kDw>
void backward_rows(float *dx, double *dw_part, const float *dy, const float *x, const float *w, int64_t n,
                   const float *a, const float *b) {
  __m512 av[R], bv[R];
  for (int r = 0; r < R; ++r) av[r] = _mm512_set1_ps(a[r]), bv[r] = _mm512_set1_ps(b[r]);
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 wv = kW ? _mm512_loadu_ps(w + i) : _mm512_setzero_ps();
    __m512d part_lo, part_hi;
    if constexpr (kDw) part_lo = _mm512_loadu_pd(dw_part + i), part_hi = _mm512_loadu_pd(dw_part + i + 8);
    for (int r = 0; r < R; ++r) {
      const __m512 g = _mm512_loadu_ps(dy + r * n + i), xv = _mm512_loadu_ps(x + r * n + i);
      if constexpr (kDx) {
        const __m512 gw = kW ? _mm512_mul_ps(g, wv) : g;
        _mm512_storeu_ps(dx + r * n + i, _mm512_fmadd_ps(gw, av[r], _mm512_mul_ps(xv, bv[r])));
      }
      if constexpr (kDw) {
        const __m512 t = _mm512_mul_ps(_mm512_mul_ps(g, xv), av[r]);
        part_lo = _mm512_add_pd(part_lo, _mm512_cvtps_pd(low(t)));
        part_hi = _mm512_add_pd(part_hi, _mm512_cvtps_pd(high(t)));
      }
    }
    if constexpr (kDw) _mm512_storeu_pd(dw_part + i, part_lo), _mm512_storeu_pd(dw_part + i + 8, part_hi);
  }
}

template <bool kW, bool kDx, bool kDw>
void backward_rows_of(int rows, float *dx, double *dw_part, const float *dy, const float *x, const float *w, int64_t n,
                      const float *a, const float *b) {
  switch (rows) {
    case 4:
      return backward_rows<4, kW, kDx, kDw>(dx, dw_part, dy, x, w, n, a, b);
    case 3:
      return backward_rows<3, kW, kDx, kDw>(dx, dw_part, dy, x, w, n, a, b);
    case 2:
      return backward_rows<2, kW, kDx, kDw>(dx, dw_part, dy, x, w, n, a, b);
    default:
      return backward_rows<1, kW, kDx, kDw>(dx, dw_part, dy, x, w, n, a, b);
  }
}

}  // namespace

void sum_squares_avx512(double *out, const float *x, int64_t n, int rows) {
  switch (rows) {
    case 4:
      return sum_squares<4>(out, x, n);
    case 3:
      return sum_squares<3>(out, x, n);
    case 2:
      return sum_squares<2>(out, x, n);
    default:
      return sum_squares<1>(out, x, n);
  }
}

void scale_row_avx512(float *y, const float *x, int64_t n, float rstd, const float *w) {
  const __m512 rs = _mm512_set1_ps(rstd);
  if (w)
    for (int64_t i = 0; i < n; i += 16)
      _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), rs), _mm512_loadu_ps(w + i)));
  else
    for (int64_t i = 0; i < n; i += 16) _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), rs));
}

void weighted_dots_avx512(double *out, const float *dy, const float *x, const float *w, int64_t n, int rows) {
  const auto run = [&](auto with_w) {
    constexpr bool kW = decltype(with_w)::value;
    switch (rows) {
      case 4:
        return weighted_dots<4, kW>(out, dy, x, w, n);
      case 3:
        return weighted_dots<3, kW>(out, dy, x, w, n);
      case 2:
        return weighted_dots<2, kW>(out, dy, x, w, n);
      default:
        return weighted_dots<1, kW>(out, dy, x, w, n);
    }
  };
  if (w)
    run(std::true_type{});
  else
    run(std::false_type{});
}

void backward_rows_avx512(float *dx, double *dw_part, const float *dy, const float *x, const float *w, int64_t n,
                          int rows, const float *a, const float *b) {
  // one loop for each combination of what is there
  using Rows = void (*)(int, float *, double *, const float *, const float *, const float *, int64_t, const float *,
                        const float *);
  static constexpr Rows loops[8] = {backward_rows_of<false, false, false>, backward_rows_of<false, false, true>,
                                    backward_rows_of<false, true, false>,  backward_rows_of<false, true, true>,
                                    backward_rows_of<true, false, false>,  backward_rows_of<true, false, true>,
                                    backward_rows_of<true, true, false>,   backward_rows_of<true, true, true>};
  loops[(w ? 4 : 0) | (dx ? 2 : 0) | (dw_part ? 1 : 0)](rows, dx, dw_part, dy, x, w, n, a, b);
}

}  // namespace ember::cpu::rms_norm_rows

#include "kernels/cpu/avx512_code_end.inc"
