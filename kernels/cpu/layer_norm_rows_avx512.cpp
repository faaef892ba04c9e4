// 16-lane twins of the layer norm row loops (kernels/cpu/layer_norm_rows_avx512.h).
#include "kernels/cpu/layer_norm_rows_avx512.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/avx512_code_begin.inc"

namespace ember::cpu {
namespace {

constexpr int64_t kFlush = 512;  // as ln_detail::kFlush: partial sums go to double this often

// v as it stands, rounded: keeps the compiler from fusing the operation that made v into an FMA
// (as ln_detail::rounded does for the 8-lane loops).
template <typename V>
inline V rounded(V v) {
  asm("" : "+v"(v));
  return v;
}

inline __m256 low(__m512 v) { return _mm512_castps512_ps256(v); }
inline __m256 high(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }

// vec8::hsum: lanes widened to double, halves added, then (0 + 2) + (1 + 3)
inline double hsum(__m256 v) {
  const __m256d s = _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
  alignas(32) double d[4];
  _mm256_store_pd(d, s);
  return (d[0] + d[2]) + (d[1] + d[3]);
}

template <bool kW, bool kDw, bool kDb, bool kCopy>
void backward_row(float* dh, const float* g, const float* h, int64_t n, float mean, float rstd, const float* w,
                  float* dw, float* db, float* dh_copy) {
  const __m512 m = _mm512_set1_ps(mean), rs = _mm512_set1_ps(rstd);
  double sum_gw = 0, sum_gw_xh = 0;
  for (int64_t blk = 0; blk < n; blk += kFlush) {
    const int64_t end = std::min(n, blk + kFlush);
    __m256 acc_gw = _mm256_setzero_ps(), acc_gw_xh = _mm256_setzero_ps();
    for (int64_t i = blk; i < end; i += 16) {
      const __m512 gv = _mm512_loadu_ps(g + i);
      const __m512 xv = rounded(_mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(h + i), m), rs));
      const __m512 gwv = kW ? rounded(_mm512_mul_ps(gv, _mm512_loadu_ps(w + i))) : gv;
      acc_gw = _mm256_add_ps(acc_gw, low(gwv));
      acc_gw = _mm256_add_ps(acc_gw, high(gwv));
      if constexpr (kW) {
        acc_gw_xh = _mm256_fmadd_ps(low(gwv), low(xv), acc_gw_xh);
        acc_gw_xh = _mm256_fmadd_ps(high(gwv), high(xv), acc_gw_xh);
      } else {
        const __m512 p = rounded(_mm512_mul_ps(gwv, xv));
        acc_gw_xh = _mm256_add_ps(acc_gw_xh, low(p));
        acc_gw_xh = _mm256_add_ps(acc_gw_xh, high(p));
      }
      if constexpr (kDw) _mm512_storeu_ps(dw + i, _mm512_fmadd_ps(gv, xv, _mm512_loadu_ps(dw + i)));
      if constexpr (kDb) _mm512_storeu_ps(db + i, _mm512_add_ps(_mm512_loadu_ps(db + i), gv));
    }
    sum_gw += hsum(acc_gw);
    sum_gw_xh += hsum(acc_gw_xh);
  }
  const __m512 a = _mm512_set1_ps(float(sum_gw / double(n))), c = _mm512_set1_ps(float(sum_gw_xh / double(n)));
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 xv = rounded(_mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(h + i), m), rs));
    const __m512 gv = _mm512_loadu_ps(g + i);
    const __m512 gwv = kW ? rounded(_mm512_mul_ps(gv, _mm512_loadu_ps(w + i))) : gv;
    // rstd (gw - a - xhat c), the last two as one FMA, as the 8-lane loop
    const __m512 v = _mm512_mul_ps(rs, _mm512_fnmadd_ps(xv, c, rounded(_mm512_sub_ps(gwv, a))));
    _mm512_storeu_ps(dh + i, v);
    if constexpr (kCopy) _mm512_storeu_ps(dh_copy + i, v);
  }
}

}  // namespace

void layer_norm_apply_row_avx512(float* y, const float* h, int64_t n, float mean, float rstd, const float* w,
                                 const float* b) {
  const __m512 m = _mm512_set1_ps(mean), rs = _mm512_set1_ps(rstd);
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 v = rounded(_mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(h + i), m), rs));
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(v, _mm512_loadu_ps(w + i), _mm512_loadu_ps(b + i)));
  }
}

void layer_norm_backward_row_avx512(float* dh, const float* g, const float* h, int64_t n, float mean, float rstd,
                                    const float* w, float* dw, float* db, float* dh_copy) {
  // one loop for each combination of what is there
  using Row = void (*)(float*, const float*, const float*, int64_t, float, float, const float*, float*, float*, float*);
  static constexpr Row rows[16] = {
      backward_row<false, false, false, false>, backward_row<false, false, false, true>,
      backward_row<false, false, true, false>,  backward_row<false, false, true, true>,
      backward_row<false, true, false, false>,  backward_row<false, true, false, true>,
      backward_row<false, true, true, false>,   backward_row<false, true, true, true>,
      backward_row<true, false, false, false>,  backward_row<true, false, false, true>,
      backward_row<true, false, true, false>,   backward_row<true, false, true, true>,
      backward_row<true, true, false, false>,   backward_row<true, true, false, true>,
      backward_row<true, true, true, false>,    backward_row<true, true, true, true>};
  const int which = (w ? 8 : 0) | (dw ? 4 : 0) | (db ? 2 : 0) | (dh_copy ? 1 : 0);
  rows[which](dh, g, h, n, mean, rstd, w, dw, db, dh_copy);
}

}  // namespace ember::cpu

#include "kernels/cpu/avx512_code_end.inc"
