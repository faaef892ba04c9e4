// Softmax of float rows, R rows at a time, shared by the plain softmax
// (kernels/cpu/normalization_softmax.cpp) and the scaled masked softmax of
// kernels/cpu/fused_softmax_rows.h (fused softmax, attention):
//   m = max x,  e = exp(x - m),  y = e * (1 / sum e).
// A short row is a chain of dependent steps (its max before its exps, its sum before its scale),
// so rows go a few at a time to overlap their chains. Each row's arithmetic is the same whatever R
// is, so a row gives the same bits alone or in a group, and results do not depend on how rows
// are split among threads. Sums accumulate in float lanes flushed into double every 512 elements.
// The exps (16 vector instructions per 8 lanes) set the pace: rows of 128 take 0.55 to 0.6 ns per
// element on one Zen 3 thread for R of 2 to 4 (R = 1: 0.7), and keeping the sums out of stack
// spills measured no faster; what helps is fewer instructions or fewer passes over a row. So
// where the CPU has AVX-512, the entry points below that take `wide` run the same steps on 16
// lanes (kernels/cpu/softmax_avx512.h), giving the same bits.
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>

#include "core/cpu_features.h"
#include "kernels/cpu/softmax_avx512.h"
#include "kernels/cpu/vec8.h"

namespace ember::cpu {

// Whether the row code runs on 16 lanes: where the CPU has AVX-512 and EMBER_CPU_CAPABILITY does
// not ask for avx2. An op reads it once and passes it down.
inline bool wide_rows() { return cpu_capability() == CpuCapability::Avx512; }

constexpr int64_t kSoftmaxFlush = 64 * vec8::kLanes;

// Max of R float rows, NaNs ignored: a NaN anywhere still makes the whole row NaN, through its
// exp and so the row sum, without a compare per element here. Two lanes of accumulators per
// row, so the compares do not wait on each other; max is exact, so the order does not matter.
template <int R>
EMBER_LANES_INLINE void rows_max(float* m, const float* const* v, int64_t n) {
  using namespace vec8;
  const float ninf = -std::numeric_limits<float>::infinity();
  f8 a[R], b[R];
  for (int r = 0; r < R; ++r) a[r] = b[r] = f8{} + ninf;
  int64_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes)
    for (int r = 0; r < R; ++r) {
      const f8 x = load8(v[r] + i), x2 = load8(v[r] + i + kLanes);
      a[r] = x > a[r] ? x : a[r];
      b[r] = x2 > b[r] ? x2 : b[r];
    }
  for (; i + kLanes <= n; i += kLanes)
    for (int r = 0; r < R; ++r) {
      const f8 x = load8(v[r] + i);
      a[r] = x > a[r] ? x : a[r];
    }
  if (i < n)
    for (int r = 0; r < R; ++r) {
      const f8 x = load_tail(v[r] + i, n - i, ninf);
      b[r] = x > b[r] ? x : b[r];
    }
  for (int r = 0; r < R; ++r) m[r] = hmax(a[r] > b[r] ? a[r] : b[r]);
}

// Writes exp(v[r] - m[r]) into e[r] (when e is not null; e[r] may be v[r]) and stores its sum in
// total[r]. m[r] is at least row r's max (v - m <= 0, or NaN), which exp8_nonpositive takes.
// The row pointers, shifts and sums live in locals: a store through e[r] could otherwise alias
// the arrays passed in, whose values would then be loaded again after every store.
template <int R>
EMBER_LANES_INLINE void exp_shifted_rows(double* total, float* const* e_rows, const float* const* v_rows, int64_t n,
                                         const float* shifts) {
  using namespace vec8;
  const bool store = e_rows != nullptr;
  const float* v[R];
  float* e[R];
  float m[R];
  double t[R];
  for (int r = 0; r < R; ++r) {
    v[r] = v_rows[r];
    e[r] = store ? e_rows[r] : nullptr;
    m[r] = shifts[r];
    t[r] = 0;
  }
  for (int64_t b = 0; b < n; b += kSoftmaxFlush) {
    const int64_t end = std::min(n, b + kSoftmaxFlush);
    f8 acc[R], acc2[R];  // two chains of adds per row, so they do not set the pace
    for (int r = 0; r < R; ++r) acc[r] = acc2[r] = f8{};
    int64_t i = b;
    for (; i + 2 * kLanes <= end; i += 2 * kLanes)
      for (int r = 0; r < R; ++r) {
        const f8 x = exp8_nonpositive(load8(v[r] + i) - m[r]);
        const f8 x2 = exp8_nonpositive(load8(v[r] + i + kLanes) - m[r]);
        if (store) store8(e[r] + i, x), store8(e[r] + i + kLanes, x2);
        acc[r] += x;
        acc2[r] += x2;
      }
    for (; i + kLanes <= end; i += kLanes)
      for (int r = 0; r < R; ++r) {
        const f8 x = exp8_nonpositive(load8(v[r] + i) - m[r]);
        if (store) store8(e[r] + i, x);
        acc[r] += x;
      }
    if (i < end)
      for (int r = 0; r < R; ++r) {
        const f8 x = exp8_nonpositive(load_tail(v[r] + i, end - i, -std::numeric_limits<float>::infinity()) - m[r]);
        if (store) store_tail(e[r] + i, x, end - i);
        acc[r] += x;
      }
    for (int r = 0; r < R; ++r) t[r] += hsum(acc[r] + acc2[r]);
  }
  for (int r = 0; r < R; ++r) total[r] = t[r];
}

// y[r] *= s[r]
template <int R>
EMBER_LANES_INLINE void scale_rows(float* const* y, int64_t n, const float* s) {
  using namespace vec8;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int r = 0; r < R; ++r) store8(y[r] + i, load8(y[r] + i) * s[r]);
  for (; i < n; ++i)
    for (int r = 0; r < R; ++r) y[r][i] *= s[r];
}

// y[r] = softmax(x[r]) given each row's max m[r] (x and y may alias); inv[r] gets 1 / sum.
// exp(x - max) goes straight into y and is scaled there, so a row is read twice and written twice
// while it sits in L1.
template <int R>
EMBER_LANES_INLINE void softmax_rows_from_max(float* const* y, const float* const* x, int64_t n, const float* m,
                                              float* inv) {
  double total[R];
  exp_shifted_rows<R>(total, y, x, n, m);
  for (int r = 0; r < R; ++r) inv[r] = float(1.0 / total[r]);
  scale_rows<R>(y, n, inv);
}

// y[r] = softmax(x[r]); x and y may alias. m[r] and inv[r] get the row's max and 1 / sum, the
// statistics softmax_rows_from_stats takes. wide: on 16 lanes (R at most 3).
template <int R>
void softmax_rows(float* const* y, const float* const* x, int64_t n, float* m, float* inv, bool wide) {
  if (wide) return softmax_rows_avx512(R, y, x, n, m, inv);
  // the statistics stay in locals until the end: stores into y might otherwise alias m and inv,
  // and the loops would load them again at every step
  float mr[R], ir[R];
  rows_max<R>(mr, x, n);
  softmax_rows_from_max<R>(y, x, n, mr, ir);
  for (int r = 0; r < R; ++r) m[r] = mr[r], inv[r] = ir[r];
}

// softmax_rows' y again, bit for bit, from the statistics it gave (x and y may alias).
template <int R>
void softmax_rows_from_stats(float* const* y, const float* const* x, int64_t n, const float* m, const float* inv) {
  float mr[R], ir[R];  // locals, as in softmax_rows
  for (int r = 0; r < R; ++r) mr[r] = m[r], ir[r] = inv[r];
  double unused[R];
  exp_shifted_rows<R>(unused, y, x, n, mr);
  scale_rows<R>(y, n, ir);
}

}  // namespace ember::cpu
