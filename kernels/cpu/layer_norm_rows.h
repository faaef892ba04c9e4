// Layer norm of one float row, forward and backward, on 8 float lanes (the apply and backward
// loops of rows of a multiple of 16 go to their 16-lane twins, kernels/cpu/layer_norm_rows_avx512.h,
// where the CPU has AVX-512: the same bits). Shared by the layer norm kernels (f32, bf16 and f16
// data are widened to float rows) and the fused residual add + layer norm kernels, so both
// compute identically.
//
// Statistics take two passes over the row (mean, then the mean squared deviation), each summed in
// float lanes that are flushed into double every 512 elements: no cancellation from a large mean,
// and long rows keep double accuracy.
#pragma once
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/cpu_features.h"
#include "kernels/cpu/layer_norm_rows_avx512.h"
#include "kernels/cpu/vec8.h"

namespace ember::cpu {

struct RowStats {
  float mean, rstd;
};

namespace ln_detail {
constexpr int64_t kFlush = 64 * vec8::kLanes;

// total[r] = sum over i < n of term(r, i, k) (an f8 of the k = 8 elements at i, or of the last
// k < 8 padded with zeros) for R rows at once: their chains of adds overlap, and each row's sum is
// the same whatever R is. Inlined into its callers, which hand their row pointers over in local
// arrays: a term's stores (memcpy, which may alias anything) would otherwise make every
// iteration reload the pointers through the caller's arrays.
template <int R, typename Term>
EMBER_LANES_INLINE void lane_sums(double* total, int64_t n, const Term& term) {
  using namespace vec8;
  for (int r = 0; r < R; ++r) total[r] = 0;
  for (int64_t b = 0; b < n; b += kFlush) {
    const int64_t e = std::min(n, b + kFlush);
    f8 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = f8{};
    int64_t i = b;
    for (; i + kLanes <= e; i += kLanes)
      for (int r = 0; r < R; ++r) acc[r] += term(r, i, kLanes);
    if (i < e)
      for (int r = 0; r < R; ++r) acc[r] += term(r, i, e - i);
    for (int r = 0; r < R; ++r) total[r] += hsum(acc[r]);
  }
}

inline vec8::f8 load_n(const float* p, int64_t i, int64_t k) {
  return k == vec8::kLanes ? vec8::load8(p + i) : vec8::load_tail(p + i, k, 0.0f);
}

// v as it stands, rounded: the compiler may not fuse the operation that made v into the one
// that uses it (an FMA), so every copy of a loop rounds alike whatever it inlines into.
template <typename V>
EMBER_LANES_INLINE V rounded(V v) {
#if defined(__x86_64__)
  asm("" : "+x"(v));
#endif
  return v;
}

// a * b + c rounded once (an FMA) for certain, where rounded() pins the opposite.
EMBER_LANES_INLINE vec8::f8 fused_mul_add(vec8::f8 a, vec8::f8 b, vec8::f8 c) {
#if defined(__FMA__)
  return std::bit_cast<vec8::f8>(
      _mm256_fmadd_ps(std::bit_cast<__m256>(a), std::bit_cast<__m256>(b), std::bit_cast<__m256>(c)));
#else
  vec8::f8 r;
  for (int k = 0; k < vec8::kLanes; ++k) r[k] = std::fma(a[k], b[k], c[k]);
  return r;
#endif
}
EMBER_LANES_INLINE float fused_mul_add(float a, float b, float c) { return std::fma(a, b, c); }
}  // namespace ln_detail

// The sums of R rows h[r][0, n), as layer_norm_rows_stats_from_sums takes them.
template <int R>
void layer_norm_rows_sums(double* sum, const float* const* h, int64_t n) {
  const float* hr[R];
  for (int r = 0; r < R; ++r) hr[r] = h[r];
  ln_detail::lane_sums<R>(sum, n, [&](int r, int64_t i, int64_t k) { return ln_detail::load_n(hr[r], i, k); });
}

// Mean and 1 / sqrt(biased variance + eps) of R rows h[r][0, n), n >= 1, whose sums (as
// ln_detail::lane_sums adds them) are known.
template <int R>
void layer_norm_rows_stats_from_sums(RowStats* stats, const float* const* h, const double* sum, int64_t n,
                                     double eps) {
  using namespace vec8;
  double sq[R];
  float m[R];
  const float* hr[R];
  for (int r = 0; r < R; ++r) m[r] = float(sum[r] / double(n)), hr[r] = h[r];
  ln_detail::lane_sums<R>(sq, n, [&](int r, int64_t i, int64_t k) {
    // padded lanes hold m - m = 0
    const f8 d = (k == kLanes ? load8(hr[r] + i) : load_tail(hr[r] + i, k, m[r])) - m[r];
    return d * d;
  });
  for (int r = 0; r < R; ++r) stats[r] = {m[r], float(1.0 / std::sqrt(sq[r] / double(n) + eps))};
}

// Mean and 1 / sqrt(biased variance + eps) of R rows h[r][0, n), n >= 1, at once (a row's
// statistics are the same alone or in a group).
template <int R>
void layer_norm_rows_stats(RowStats* stats, const float* const* h, int64_t n, double eps) {
  double sum[R];
  layer_norm_rows_sums<R>(sum, h, n);
  layer_norm_rows_stats_from_sums<R>(stats, h, sum, n, eps);
}

// h[r] = a[r] + b[r] for R f32 rows of n, returning their sums in `sum` as
// layer_norm_rows_stats_from_sums takes them: the residual add and the first statistics pass in
// one pass over the rows.
template <int R>
void add_rows_with_sums(double* sum, float* const* h, const float* const* a, const float* const* b, int64_t n) {
  using namespace vec8;
  float* hr[R];
  const float* ar[R];
  const float* br[R];
  for (int r = 0; r < R; ++r) hr[r] = h[r], ar[r] = a[r], br[r] = b[r];
  ln_detail::lane_sums<R>(sum, n, [&](int r, int64_t i, int64_t k) {
    if (k == kLanes) {
      const f8 v = load8(ar[r] + i) + load8(br[r] + i);
      store8(hr[r] + i, v);
      return v;
    }
    const f8 v = load_tail(ar[r] + i, k, 0.0f) + load_tail(br[r] + i, k, 0.0f);
    store_tail(hr[r] + i, v, k);
    return v;
  });
}

// y = (h - mean) * rstd * w + b; w and b may be null (ones, zeros). y may alias h. With both,
// the product and the sum round once (an FMA) in every copy of this loop, so a row's bits do not
// depend on where it was inlined or whether it came alone or in a pair.
inline void layer_norm_apply_row(float* y, const float* h, int64_t n, RowStats s, const float* w, const float* b) {
  using namespace vec8;
  using ln_detail::fused_mul_add;
  if (w && b && n % 16 == 0 && cpu_capability() == CpuCapability::Avx512)
    return layer_norm_apply_row_avx512(y, h, n, s.mean, s.rstd, w, b);
  auto row = [&](auto with_w, auto with_b) {
    constexpr bool kW = decltype(with_w)::value, kB = decltype(with_b)::value;
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      const f8 v = (load8(h + i) - s.mean) * s.rstd;
      if constexpr (kW && kB) store8(y + i, fused_mul_add(v, load8(w + i), load8(b + i)));
      else if constexpr (kW) store8(y + i, v * load8(w + i));
      else if constexpr (kB) store8(y + i, v + load8(b + i));
      else store8(y + i, v);
    }
    for (; i < n; ++i) {
      const float v = (h[i] - s.mean) * s.rstd;
      if constexpr (kW && kB) y[i] = fused_mul_add(v, w[i], b[i]);
      else if constexpr (kW) y[i] = v * w[i];
      else if constexpr (kB) y[i] = v + b[i];
      else y[i] = v;
    }
  };
  using yes = std::true_type;
  using no = std::false_type;
  if (w && b) row(yes{}, yes{});
  else if (w) row(yes{}, no{});
  else if (b) row(no{}, yes{});
  else row(no{}, no{});
}

// From the output gradient g and the normalised input h of one row:
//   dh = rstd * (g w - mean(g w) - xhat mean(g w xhat)),  xhat = (h - mean) * rstd,
// and, when dw / db are not null, dw[j] += g xhat and db[j] += g (float sums, which the callers
// keep per fixed chunk of rows and add up in double). w may be null (ones). dh may alias g.
// dh_copy, when not null, gets the same values (a second gradient tensor, written from registers).
//
// Two passes over a row that stays in L1: the first sums g w and g w xhat and updates dw / db,
// the second recomputes xhat and g w and writes dh. g w and xhat are rounded before use in both
// passes (no FMA folds them into what follows), so the passes agree and a row whose terms cancel
// exactly (a single column, say) gives exactly 0; the FMAs that remain are spelled out, so every
// copy of these loops rounds alike. Recomputing measured a little faster than storing xhat and
// g w to scratch and reading them back; rows two at a time (sharing the loads and stores of w,
// dw and db) measured 20% slower, the pass being bound by its streams of loads and stores.
inline void layer_norm_backward_row(float* dh, const float* g, const float* h, int64_t n, RowStats s, const float* w,
                                    float* dw, float* db, float* dh_copy = nullptr) {
  using namespace vec8;
  using ln_detail::fused_mul_add;
  using ln_detail::rounded;
  const float mean = s.mean, rstd = s.rstd;
  if (n % 16 == 0 && cpu_capability() == CpuCapability::Avx512)
    return layer_norm_backward_row_avx512(dh, g, h, n, mean, rstd, w, dw, db, dh_copy);
  double sum_gw = 0, sum_gw_xh = 0;
  for (int64_t blk = 0; blk < n; blk += ln_detail::kFlush) {
    const int64_t end = std::min(n, blk + ln_detail::kFlush);
    f8 acc_gw = f8{}, acc_gw_xh = f8{};
    int64_t i = blk;
    for (; i + kLanes <= end; i += kLanes) {
      const f8 gv = load8(g + i);
      const f8 xv = rounded((load8(h + i) - mean) * rstd);
      const f8 gwv = w ? rounded(gv * load8(w + i)) : gv;
      acc_gw += gwv;
      // one rounding with a weight, two without: the sums exactly as the kernels have long made them
      acc_gw_xh = w ? fused_mul_add(gwv, xv, acc_gw_xh) : acc_gw_xh + rounded(gwv * xv);
      if (dw) store8(dw + i, fused_mul_add(gv, xv, load8(dw + i)));
      if (db) store8(db + i, load8(db + i) + gv);
    }
    for (; i < end; ++i) {
      const float xv = rounded((h[i] - mean) * rstd);
      const float gwv = w ? rounded(g[i] * w[i]) : g[i];
      sum_gw += double(gwv);
      sum_gw_xh += double(gwv * xv);
      if (dw) dw[i] = fused_mul_add(g[i], xv, dw[i]);
      if (db) db[i] += g[i];
    }
    sum_gw += hsum(acc_gw);
    sum_gw_xh += hsum(acc_gw_xh);
  }
  const float a = float(sum_gw / double(n)), c = float(sum_gw_xh / double(n));
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const f8 xv = rounded((load8(h + i) - mean) * rstd);
    const f8 gwv = w ? rounded(load8(g + i) * load8(w + i)) : load8(g + i);
    const f8 v = rstd * fused_mul_add(-xv, f8{} + c, rounded(gwv - a));
    store8(dh + i, v);
    if (dh_copy) store8(dh_copy + i, v);
  }
  for (; i < n; ++i) {
    const float xv = rounded((h[i] - mean) * rstd);
    const float gwv = w ? rounded(g[i] * w[i]) : g[i];
    dh[i] = rstd * fused_mul_add(-xv, c, rounded(gwv - a));
    if (dh_copy) dh_copy[i] = dh[i];
  }
}

}  // namespace ember::cpu
