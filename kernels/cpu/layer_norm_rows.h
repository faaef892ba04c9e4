// Layer norm of one float row, forward and backward, on 8 float lanes. Shared by the layer norm
// kernels (f32, bf16 and f16 data are widened to float rows) and the fused residual add + layer
// norm kernels, so both compute identically.
//
// Statistics take two passes over the row (mean, then the mean squared deviation), each summed in
// float lanes that are flushed into double every 512 elements: no cancellation from a large mean,
// and long rows keep double accuracy.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/vec8.h"

namespace ember::cpu {

struct RowStats {
  float mean, rstd;
};

namespace ln_detail {
constexpr int64_t kFlush = 64 * vec8::kLanes;

// total[r] = sum over i < n of term(r, i, k) (an f8 of the k = 8 elements at i, or of the last
// k < 8 padded with zeros) for R rows at once: their chains of adds overlap, and each row's sum is
// the same whatever R is.
template <int R, typename Term>
void lane_sums(double* total, int64_t n, const Term& term) {
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
}  // namespace ln_detail

// Mean and 1 / sqrt(biased variance + eps) of R rows h[r][0, n), n >= 1, at once (a row's
// statistics are the same alone or in a group).
template <int R>
void layer_norm_rows_stats(RowStats* stats, const float* const* h, int64_t n, double eps) {
  using namespace vec8;
  using ln_detail::load_n;
  double sum[R], sq[R];
  ln_detail::lane_sums<R>(sum, n, [&](int r, int64_t i, int64_t k) { return load_n(h[r], i, k); });
  float m[R];
  for (int r = 0; r < R; ++r) m[r] = float(sum[r] / double(n));
  ln_detail::lane_sums<R>(sq, n, [&](int r, int64_t i, int64_t k) {
    // padded lanes hold m - m = 0
    const f8 d = (k == kLanes ? load8(h[r] + i) : load_tail(h[r] + i, k, m[r])) - m[r];
    return d * d;
  });
  for (int r = 0; r < R; ++r) stats[r] = {m[r], float(1.0 / std::sqrt(sq[r] / double(n) + eps))};
}

// y = (h - mean) * rstd * w + b; w and b may be null (ones, zeros). y may alias h.
inline void layer_norm_apply_row(float* y, const float* h, int64_t n, RowStats s, const float* w, const float* b) {
  using namespace vec8;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    f8 v = (load8(h + i) - s.mean) * s.rstd;
    if (w) v = v * load8(w + i);
    if (b) v = v + load8(b + i);
    store8(y + i, v);
  }
  for (; i < n; ++i) {
    float v = (h[i] - s.mean) * s.rstd;
    if (w) v = v * w[i];
    if (b) v = v + b[i];
    y[i] = v;
  }
}

// From the output gradient g and the normalised input h of one row:
//   dh = rstd * (g w - mean(g w) - xhat mean(g w xhat)),  xhat = (h - mean) * rstd,
// and, when dw / db are not null, dw[j] += g xhat and db[j] += g (float sums, which the callers
// keep per fixed chunk of rows and add up in double). w may be null (ones). dh may alias g.
// scratch holds 2 n floats. One pass computes xhat and g w into scratch, their two row sums and
// the dw / db terms; a second writes dh (about 23 vector instructions per 8 elements, against 38
// when each of those was a pass of its own). g w is rounded once into scratch and reused, so a
// row whose terms cancel exactly (a single column, say) gives exactly 0 whatever the compiler
// contracts into FMAs. Rows stay one at a time here: two at a time (their sums overlapping, as
// in the forward) measured about 10% slower, the pass being bound by its streams of loads and
// stores, which a pair doubles, rather than by the chains of its two sums.
inline void layer_norm_backward_row(float* dh, const float* g, const float* h, int64_t n, RowStats s, const float* w,
                                    float* dw, float* db, float* scratch) {
  using namespace vec8;
  float* xh = scratch;
  float* gw = scratch + n;
  double sum_gw = 0, sum_gw_xh = 0;
  for (int64_t blk = 0; blk < n; blk += ln_detail::kFlush) {
    const int64_t end = std::min(n, blk + ln_detail::kFlush);
    f8 acc_gw = f8{}, acc_gw_xh = f8{};
    int64_t i = blk;
    for (; i + kLanes <= end; i += kLanes) {
      const f8 gv = load8(g + i);
      const f8 xv = (load8(h + i) - s.mean) * s.rstd;
      const f8 gwv = w ? gv * load8(w + i) : gv;
      store8(xh + i, xv);
      store8(gw + i, gwv);
      acc_gw += gwv;
      acc_gw_xh += gwv * xv;
      if (dw) store8(dw + i, load8(dw + i) + gv * xv);
      if (db) store8(db + i, load8(db + i) + gv);
    }
    for (; i < end; ++i) {
      const float xv = (h[i] - s.mean) * s.rstd;
      const float gwv = w ? g[i] * w[i] : g[i];
      xh[i] = xv;
      gw[i] = gwv;
      sum_gw += double(gwv);
      sum_gw_xh += double(gwv * xv);
      if (dw) dw[i] += g[i] * xv;
      if (db) db[i] += g[i];
    }
    sum_gw += hsum(acc_gw);
    sum_gw_xh += hsum(acc_gw_xh);
  }
  const float a = float(sum_gw / double(n)), c = float(sum_gw_xh / double(n));
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) store8(dh + i, s.rstd * (load8(gw + i) - a - load8(xh + i) * c));
  for (; i < n; ++i) dh[i] = s.rstd * (gw[i] - a - xh[i] * c);
}

}  // namespace ember::cpu
