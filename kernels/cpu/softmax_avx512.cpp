// 16-lane softmax rows (kernels/cpu/softmax_avx512.h). Everything after the target pragma is
// compiled for AVX-512 and lives in this file only (an unnamed namespace), so no AVX-512 code can
// stand in for a function other files share; the 8-lane helpers it calls (vec8::hmax, hsum) are
// defined before the pragma and inlined here.
//
// Why the bits are the 8-lane code's (kernels/cpu/softmax_rows.h, fused_softmax_rows.h):
// - every element takes the same steps: exp through the shared kernels/cpu/exp_lanes.inc, a
//   score through one FMA (or one product without a mask);
// - the 8-lane code keeps two accumulators a row (a and b for the max, acc and acc2 for the sum),
//   one for the first and one for the second 8 elements of every 16. One 16-lane accumulator
//   holds exactly the two, in lanes 0-7 and 8-15. The last n % 16 elements go into its halves in
//   the 8-lane code's order (an 8-lane step into the first, then a padded tail), and the halves
//   are folded as there (vec8::hmax, vec8::hsum).
#include "kernels/cpu/softmax_avx512.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/half.h"
#include "kernels/cpu/softmax_rows.h"  // kSoftmaxFlush
#include "kernels/cpu/vec8.h"

#include "kernels/cpu/avx512_code_begin.inc"

namespace ember::cpu {
// A namespace of its own, so these names hide (not overload) those of softmax_rows.h.
namespace lanes16 {
namespace {

// Every loop over a group's rows is unrolled (#pragma GCC unroll): GCC otherwise keeps the rows'
// maxima and sums in arrays on the stack and reads them back merged (two or four floats in one
// load), which no store can forward, so each group stalled until its stores retired (the fused
// rows of 128, four at a time, in L2: 0.49 against 0.40 ns an element).
using Lanes = float __attribute__((vector_size(64)));
using ULanes = uint32_t __attribute__((vector_size(64)));
using vec8::f8;
constexpr int64_t kWidth = 16;
constexpr int64_t kHalf = vec8::kLanes;

#include "kernels/cpu/exp_lanes.inc"

inline __m512 raw(Lanes v) { return __builtin_bit_cast(__m512, v); }
inline Lanes lanes(__m512 v) { return __builtin_bit_cast(Lanes, v); }

// vec8::exp8_nonpositive: _mm512_max_ps returns its second operand for NaN, as the 8-lane one does
EMBER_LANES_INLINE Lanes exp_nonpositive(Lanes x) {
  return exp_clamped_lanes(lanes(_mm512_max_ps(_mm512_set1_ps(-88.0f), raw(x))));
}

EMBER_LANES_INLINE f8 low(Lanes v) { return __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7); }
EMBER_LANES_INLINE f8 high(Lanes v) { return __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15); }

// ---- loads and stores of 16 elements, or of the first k < 16 (the other lanes read as `fill`
// or 0, and are not written)

inline __mmask16 first(int64_t k) { return __mmask16((1u << k) - 1); }

EMBER_LANES_INLINE Lanes load(const float* p) {
  Lanes v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
EMBER_LANES_INLINE Lanes load(const BFloat16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return lanes(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
}
EMBER_LANES_INLINE Lanes load(const Half* p) {
  return lanes(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
}
EMBER_LANES_INLINE void store(float* p, Lanes v) { std::memcpy(p, &v, sizeof v); }

EMBER_LANES_INLINE Lanes load_first(const float* p, int64_t k, float fill = 0.0f) {
  return lanes(_mm512_mask_loadu_ps(_mm512_set1_ps(fill), first(k), p));
}
EMBER_LANES_INLINE Lanes load_first(const BFloat16* p, int64_t k) {
  const __m256i h = _mm256_maskz_loadu_epi16(first(k), p);
  return lanes(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
}
EMBER_LANES_INLINE Lanes load_first(const Half* p, int64_t k) {
  return lanes(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(first(k), p)));
}
EMBER_LANES_INLINE void store_first(float* p, Lanes v, int64_t k) { _mm512_mask_storeu_ps(p, first(k), raw(v)); }
// the first k < 8 elements, the other lanes `fill` (vec8::load_tail)
EMBER_LANES_INLINE f8 load8_first(const float* p, int64_t k, float fill) {
  return __builtin_bit_cast(f8, _mm256_mask_loadu_ps(_mm256_set1_ps(fill), __mmask8((1u << k) - 1), p));
}

// Asks for R rows while the group before them computes: they come from L3 or memory, and waiting
// for them otherwise stalls their first pass (rows of 128 from L3: 0.35 against 0.42 ns an
// element).
template <int R, typename T>
EMBER_LANES_INLINE void prefetch_rows(const T* const* rows, int64_t n) {
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const char* row = reinterpret_cast<const char*>(rows[r]);
    for (int64_t b = 0; b < n * int64_t(sizeof(T)); b += 64) _mm_prefetch(row + b, _MM_HINT_T0);
  }
}
// The R rows that follow these in memory, the next group's where rows lie one after another (as
// the plain and the fused softmax take them); a prefetch never faults, so rows laid out otherwise
// only waste it.
template <int R, typename T>
EMBER_LANES_INLINE void prefetch_next_rows(const T* const* rows, int64_t n) {
  const T* next[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) next[r] = rows[r] + R * n;
  prefetch_rows<R>(next, n);
}

// Prefetches K rows of `bytes` each a cache line per call of next(): called at every step of a
// loop over other rows, it spreads the prefetches over that loop's work, where a burst of them
// for whole rows fills the line fill buffers and stalls the loop behind them.
template <int K>
struct SpreadPrefetch {
  const char* rows[K] = {};
  int64_t bytes = 0, at = 0;
  SpreadPrefetch() = default;
  template <typename T>
  SpreadPrefetch(const T* const* r, int64_t n) : bytes(n * int64_t(sizeof(T))) {
#pragma GCC unroll 8
    for (int k = 0; k < K; ++k) rows[k] = reinterpret_cast<const char*>(r[k]);
  }
  EMBER_LANES_INLINE void next() {
    if (at < bytes)
#pragma GCC unroll 8
      for (int k = 0; k < K; ++k) _mm_prefetch(rows[k] + at, _MM_HINT_T0);
    at += 64;
  }
  void finish() {
    while (at < bytes) next();
  }
};

// Two sets of rows prefetched alike (rows of two arrays, whose element sizes may differ).
template <int K>
struct SpreadPrefetch2 {
  SpreadPrefetch<K> a, b;
  EMBER_LANES_INLINE void next() { a.next(), b.next(); }
  void finish() { a.finish(), b.finish(); }
};

// ---- softmax_rows.h

// rows_max. ab[r] holds the 8-lane code's a (lanes 0-7) and b (lanes 8-15).
template <int R>
EMBER_LANES_INLINE void rows_max(float* m, const float* const* v, int64_t n) {
  const float ninf = -std::numeric_limits<float>::infinity();
  Lanes ab[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) ab[r] = Lanes{} + ninf;
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const Lanes x = load(v[r] + i);
      ab[r] = x > ab[r] ? x : ab[r];
    }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    f8 a = low(ab[r]), b = high(ab[r]);
    int64_t j = i;
    if (j + kHalf <= n) {
      const f8 x = vec8::load8(v[r] + j);
      a = x > a ? x : a;
      j += kHalf;
    }
    if (j < n) {
      const f8 x = load8_first(v[r] + j, n - j, ninf);
      b = x > b ? x : b;
    }
    m[r] = vec8::hmax(a > b ? a : b);
  }
}

// exp_shifted_rows, always storing e. acc[r] holds the 8-lane code's acc (lanes 0-7) and acc2
// (lanes 8-15); the rest of a block after its 16s, padded with exp(-inf - m) as there, goes into
// acc: its first 8 lanes, then (past 8 elements) its last 8.
// ahead, where not null, prefetches a line of each of its rows at every step.
template <int R, bool kStore = true, typename Ahead = SpreadPrefetch<R>>
EMBER_LANES_INLINE void exp_shifted_rows(double* total, float* const* e_rows, const float* const* v_rows, int64_t n,
                                         const float* shifts, Ahead* ahead = nullptr) {
  const float ninf = -std::numeric_limits<float>::infinity();
  const float* v[R];
  float* e[R];
  float m[R];
  double t[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    v[r] = v_rows[r];
    e[r] = kStore ? e_rows[r] : nullptr;
    m[r] = shifts[r];
    t[r] = 0;
  }
  for (int64_t b = 0; b < n; b += kSoftmaxFlush) {
    const int64_t end = std::min(n, b + kSoftmaxFlush);
    Lanes acc[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r] = Lanes{};
    int64_t i = b;
    for (; i + kWidth <= end; i += kWidth) {
      if (ahead) ahead->next();
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const Lanes x = exp_nonpositive(load(v[r] + i) - m[r]);
        if (kStore) store(e[r] + i, x);
        acc[r] += x;
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      f8 lo = low(acc[r]);
      if (i < end) {
        const int64_t k = end - i;
        const Lanes x = exp_nonpositive(load_first(v[r] + i, k, ninf) - m[r]);
        if (kStore) store_first(e[r] + i, x, k);
        lo += low(x);
        if (k > kHalf) lo += high(x);
      }
      t[r] += vec8::hsum(lo + high(acc[r]));
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) total[r] = t[r];
}

template <int R>
EMBER_LANES_INLINE void scale_rows(float* const* y_rows, int64_t n, const float* s_rows) {
  float* y[R];  // locals, as in exp_shifted_rows
  float s[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) y[r] = y_rows[r], s[r] = s_rows[r];
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) store(y[r] + i, load(y[r] + i) * s[r]);
  if (i < n)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) store_first(y[r] + i, load_first(y[r] + i, n - i) * s[r], n - i);
}

template <int R>
EMBER_LANES_INLINE void softmax_rows_from_max(float* const* y, const float* const* x, int64_t n, const float* m,
                                              float* inv) {
  double total[R];
  exp_shifted_rows<R>(total, y, x, n, m);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) inv[r] = float(1.0 / total[r]);
  scale_rows<R>(y, n, inv);
}

template <int R>
void softmax_rows(float* const* y, const float* const* x, int64_t n, float* m, float* inv) {
  float mr[R], ir[R];  // locals: stores into y might otherwise alias m and inv
  prefetch_next_rows<R>(x, n);
  rows_max<R>(mr, x, n);
  softmax_rows_from_max<R>(y, x, n, mr, ir);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) m[r] = mr[r], inv[r] = ir[r];
}

template <int R>
void softmax_rows_from_stats(float* const* y, const float* const* x, int64_t n, const float* m, const float* inv) {
  float mr[R], ir[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) mr[r] = m[r], ir[r] = inv[r];
  double unused[R];
  exp_shifted_rows<R>(unused, y, x, n, mr);
  scale_rows<R>(y, n, ir);
}

// softmax_rows over `rows` rows one after another, three at a time, pipelined: while one group's
// exps run, its sums (their folds, the division) would hold back the scaling and the next group's
// max pass would hold back that group's exps; so each step runs one group's exps, then the next
// group's max pass, then the scaling of the group before (rows of 128 in L2: 0.32 against 0.37 ns
// an element). Every row takes the steps it takes alone.
void softmax_row_run(float* y, const float* x, int64_t rows, int64_t n) {
  constexpr int R = 3;
  const auto rows_at = [n](auto* base, int64_t group, auto* ptrs) {
#pragma GCC unroll 8
    for (int k = 0; k < R; ++k) ptrs[k] = base + (group * R + k) * n;
  };
  const int64_t groups = rows / R;
  float m[R] = {}, inv[R] = {};
  float* scale_next[R] = {};  // the rows of the group before, still to scale by inv
  if (groups > 0) {
    const float* xs[R];
    rows_at(x, 0, xs);
    rows_max<R>(m, xs, n);
  }
  for (int64_t g = 0; g < groups; ++g) {
    const float* xs[R];
    float* ys[R];
    rows_at(x, g, xs);
    rows_at(y, g, ys);
    if (g + 2 < groups) {
      const float* later[R];
      rows_at(x, g + 2, later);
      prefetch_rows<R>(later, n);
    }
    double total[R];
    exp_shifted_rows<R>(total, ys, xs, n, m);
    if (g + 1 < groups) {
      const float* next[R];
      rows_at(x, g + 1, next);
      rows_max<R>(m, next, n);
    }
    if (g > 0) scale_rows<R>(scale_next, n, inv);
#pragma GCC unroll 8
    for (int k = 0; k < R; ++k) inv[k] = float(1.0 / total[k]), scale_next[k] = ys[k];
  }
  if (groups > 0) scale_rows<R>(scale_next, n, inv);
  for (int64_t r = groups * R; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    float mr, ir;
    softmax_rows<1>(&yr, &xr, n, &mr, &ir);
  }
}

// ---- log_softmax (kernels/cpu/normalization_softmax.cpp)

// vec8::exp8: both clamps, a NaN kept as there
EMBER_LANES_INLINE Lanes exp_any(Lanes x) {
  return exp_clamped_lanes(
      lanes(_mm512_min_ps(_mm512_set1_ps(88.0f), _mm512_max_ps(_mm512_set1_ps(-88.0f), raw(x)))));
}

// y = (x - max) - log(sum exp(x - max)); y may be x.
void log_softmax_row(float* y, const float* x, int64_t n) {
  float m;
  rows_max<1>(&m, &x, n);
  double total;
  exp_shifted_rows<1, false>(&total, nullptr, &x, n, &m);
  const float log_sum = float(std::log(total));
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) store(y + i, (load(x + i) - m) - log_sum);
  if (i < n) store_first(y + i, (load_first(x + i, n - i) - m) - log_sum, n - i);
}

// The sum of g in row_sum's order (normalization_softmax.cpp): two chains of 8 lanes a block, in
// the halves of one 16-lane sum, the last n % 16 as in exp_shifted_rows.
EMBER_LANES_INLINE double row_sum(const float* g, int64_t n) {
  double total = 0;
  for (int64_t b = 0; b < n; b += kSoftmaxFlush) {
    const int64_t end = std::min(n, b + kSoftmaxFlush);
    Lanes acc = Lanes{};
    int64_t i = b;
    for (; i + kWidth <= end; i += kWidth) acc += load(g + i);
    f8 lo = low(acc);
    if (i < end) {
      const int64_t k = end - i;
      const Lanes x = load_first(g + i, k);
      lo += low(x);
      if (k > kHalf) lo += high(x);
    }
    total += vec8::hsum(lo + high(acc));
  }
  return total;
}

// dx = g - exp(y) * sum g; dx may be g.
void log_softmax_backward_row(float* dx, const float* g, const float* y, int64_t n) {
  const float gs = float(row_sum(g, n));
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) store(dx + i, load(g + i) - exp_any(load(y + i)) * gs);
  if (i < n) store_first(dx + i, load_first(g + i, n - i) - exp_any(load_first(y + i, n - i)) * gs, n - i);
}

// ---- fused_softmax_rows.h

// score8: x * scale + mask in one FMA, or x * scale without a mask. The product is a builtin
// (_mm512_mul_round_ps), not a vector `*`, so the compiler cannot fuse it into a subtraction that
// follows (the backward's s - max): where it did, in some row groupings only, the bits moved.
EMBER_LANES_INLINE Lanes scaled(Lanes x, float scale) {
  return lanes(_mm512_mul_round_ps(raw(x), _mm512_set1_ps(scale), _MM_FROUND_CUR_DIRECTION));
}
EMBER_LANES_INLINE Lanes score(Lanes x, float scale, const float* mask, int64_t i) {
  return mask ? lanes(_mm512_fmadd_ps(raw(x), _mm512_set1_ps(scale), raw(load(mask + i)))) : scaled(x, scale);
}
EMBER_LANES_INLINE Lanes score_first(Lanes x, float scale, const float* mask, int64_t i, int64_t k) {
  return mask ? lanes(_mm512_fmadd_ps(raw(x), _mm512_set1_ps(scale), raw(load_first(mask + i, k))))
              : scaled(x, scale);
}

template <typename T>
EMBER_LANES_INLINE void scores_row(float* v, const T* x, const float* mask, float scale, int64_t n) {
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) store(v + i, score(load(x + i), scale, mask, i));
  if (i < n) store_first(v + i, score_first(load_first(x + i, n - i), scale, mask, i, n - i), n - i);
}

// scores_row_max: a and b in the halves of ab; the last n % 8 elements, which the 8-lane code
// compares one at a time after folding its lanes, are compared so here.
template <typename T>
EMBER_LANES_INLINE float scores_row_max(float* v, const T* x, const float* mask, float scale, int64_t n) {
  Lanes ab = Lanes{} - std::numeric_limits<float>::infinity();
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) {
    const Lanes w = score(load(x + i), scale, mask, i);
    store(v + i, w);
    ab = w > ab ? w : ab;
  }
  f8 a = low(ab);
  const f8 b = high(ab);
  const int64_t k = n - i;
  if (k > 0) {
    const Lanes w = score_first(load_first(x + i, k), scale, mask, i, k);
    store_first(v + i, w, k);
    if (k >= kHalf) {
      const f8 w8 = low(w);
      a = w8 > a ? w8 : a;
      i += kHalf;
    }
  }
  float m = vec8::hmax(a > b ? a : b);
  for (; i < n; ++i) m = v[i] > m ? v[i] : m;
  return m;
}

template <int R, typename T>
void scaled_masked_softmax_rows(float* const* y, const T* const* x, const float* const* mask, float scale, int64_t n,
                                float* st) {
  float m[R], inv[R];
  prefetch_next_rows<R>(x, n);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) m[r] = scores_row_max(y[r], x[r], mask[r], scale, n);
  softmax_rows_from_max<R>(y, y, n, m, inv);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) st[2 * r] = m[r], st[2 * r + 1] = inv[r];
}

template <int R, typename T>
void scaled_masked_softmax_rows_again(float* const* y, const T* const* x, const float* const* mask, float scale,
                                      int64_t n, const float* st) {
  prefetch_next_rows<R>(x, n);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) scores_row(y[r], x[r], mask[r], scale, n);
  float m[R], inv[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) m[r] = st[2 * r], inv[r] = st[2 * r + 1];
  softmax_rows_from_stats<R>(y, y, n, m, inv);
}

// scaled_masked_softmax_rows over `rows` rows (y[r], x[r], mask[r]), four at a time, pipelined as
// softmax_row_run: each step runs one group's exps, the next group's scores and max, and the
// scaling of the group before. st gets 2 * rows statistics.
template <typename T>
void scaled_masked_softmax_run(int64_t rows, float* const* y, const T* const* x, const float* const* mask,
                               float scale, int64_t n, float* st) {
  constexpr int R = 4;
  const int64_t groups = rows / R;
  float m[R] = {}, inv[R] = {};
  if (groups > 0) {
    if (groups > 1) prefetch_rows<R>(x + R, n);  // the second group's row pointers exist
#pragma GCC unroll 8
    for (int k = 0; k < R; ++k) m[k] = scores_row_max(y[k], x[k], mask[k], scale, n);
  }
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t r = g * R;
    // the group after next, x and the y its scores will be stored in, a line a step of these
    // exps (a burst of prefetches stalled them, and so did the stores into y)
    SpreadPrefetch2<R> ahead;
    if (g + 2 < groups) ahead = {SpreadPrefetch<R>(x + r + 2 * R, n), SpreadPrefetch<R>(y + r + 2 * R, n)};
    double total[R];
    exp_shifted_rows<R>(total, y + r, y + r, n, m, &ahead);
    ahead.finish();
#pragma GCC unroll 8
    for (int k = 0; k < R; ++k) st[2 * (r + k)] = m[k];
    if (g + 1 < groups)
#pragma GCC unroll 8
      for (int k = 0; k < R; ++k) m[k] = scores_row_max(y[r + R + k], x[r + R + k], mask[r + R + k], scale, n);
    if (g > 0) scale_rows<R>(y + r - R, n, inv);
#pragma GCC unroll 8
    for (int k = 0; k < R; ++k) inv[k] = float(1.0 / total[k]), st[2 * (r + k) + 1] = inv[k];
  }
  if (groups > 0) scale_rows<R>(y + (groups - 1) * R, n, inv);
  for (int64_t r = groups * R; r < rows; ++r)
    scaled_masked_softmax_rows<1>(y + r, x + r, mask + r, scale, n, st + 2 * r);
}

// ---- the scaled masked softmax's backward (kernels/cpu/fused_softmax.cpp)

// Pass one of the backward of R rows: p, the probabilities exactly as
// scaled_masked_softmax_rows_again gives them (its score, exp and scale, in one pass), into dx,
// and dots[r] = sum g * p in dot_row's order (fused_softmax_rows.h): one chain of 8-lane products
// a block, the low then the high half of every 16, the last n % 16 padded with zeros.
template <int R, typename T, typename Ahead>
EMBER_LANES_INLINE void probabilities_and_dots(float* dots, float* const* dx_rows, const T* const* x_rows,
                                               const float* const* mask_rows, const float* const* g_rows, float scale,
                                               int64_t n, const float* st, Ahead& ahead_x, Ahead& ahead_g) {
  float* dx[R];  // locals, as in exp_shifted_rows
  const T* x[R];
  const float* mask[R];
  const float* g[R];
  float m[R], inv[R];
  double t[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    dx[r] = dx_rows[r], x[r] = x_rows[r], mask[r] = mask_rows[r], g[r] = g_rows[r];
    m[r] = st[2 * r], inv[r] = st[2 * r + 1], t[r] = 0;
  }
  for (int64_t b = 0; b < n; b += kSoftmaxFlush) {
    const int64_t end = std::min(n, b + kSoftmaxFlush);
    f8 acc[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r] = f8{};
    int64_t i = b;
    for (; i + kWidth <= end; i += kWidth) {
      ahead_x.next();
      ahead_g.next();
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const Lanes p = exp_nonpositive(score(load(x[r] + i), scale, mask[r], i) - m[r]) * inv[r];
        store(dx[r] + i, p);
        const Lanes gv = load(g[r] + i);
        acc[r] += low(gv) * low(p);
        acc[r] += high(gv) * high(p);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      if (i < end) {
        const int64_t k = end - i;
        const Lanes s = score_first(load_first(x[r] + i, k), scale, mask[r], i, k);
        // the lanes past k zeroed, as dot_row pads them
        const Lanes p = lanes(_mm512_maskz_mov_ps(first(k), raw(exp_nonpositive(s - m[r]) * inv[r])));
        store_first(dx[r] + i, p, k);
        const Lanes gv = load_first(g[r] + i, k);
        acc[r] += low(gv) * low(p);
        if (k > kHalf) acc[r] += high(gv) * high(p);
      }
      t[r] += vec8::hsum(acc[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) dots[r] = float(t[r]);
}

// Pass two: dx = out_scale * (p * (g - dot)), p in dx.
template <int R>
EMBER_LANES_INLINE void input_grads(float* const* dx_rows, const float* const* g_rows, const float* dots,
                                    float out_scale, int64_t n) {
  float* dx[R];
  const float* g[R];
  float dot[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) dx[r] = dx_rows[r], g[r] = g_rows[r], dot[r] = dots[r];
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) store(dx[r] + i, out_scale * (load(dx[r] + i) * (load(g[r] + i) - dot[r])));
  if (i < n)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const int64_t k = n - i;
      store_first(dx[r] + i, out_scale * (load_first(dx[r] + i, k) * (load_first(g[r] + i, k) - dot[r])), k);
    }
}

// The backward over `rows` rows, two at a time, pipelined: each step runs one group's first pass
// and the second pass of the group before, whose dot products are then done; the rows of the
// group after next are prefetched along the way.
template <typename T>
void scaled_masked_softmax_backward_run(int64_t rows, float* const* dx, const T* const* x, const float* const* mask,
                                        const float* const* g, float scale, float out_scale, int64_t n,
                                        const float* st) {
  constexpr int R = 2;
  const int64_t groups = rows / R;
  float dots[R] = {}, before[R] = {};
  for (int64_t gi = 0; gi < groups; ++gi) {
    const int64_t r = gi * R;
    SpreadPrefetch<R> ahead_x, ahead_g;
    if (gi + 2 < groups) ahead_x = SpreadPrefetch<R>(x + r + 2 * R, n), ahead_g = SpreadPrefetch<R>(g + r + 2 * R, n);
    probabilities_and_dots<R>(dots, dx + r, x + r, mask + r, g + r, scale, n, st + 2 * r, ahead_x, ahead_g);
    ahead_x.finish();
    ahead_g.finish();
    if (gi > 0) input_grads<R>(dx + r - R, g + r - R, before, out_scale, n);
#pragma GCC unroll 8
    for (int k = 0; k < R; ++k) before[k] = dots[k];
  }
  if (groups > 0) input_grads<R>(dx + (groups - 1) * R, g + (groups - 1) * R, before, out_scale, n);
  for (int64_t r = groups * R; r < rows; ++r) {
    SpreadPrefetch<1> none;
    float dot;
    probabilities_and_dots<1>(&dot, dx + r, x + r, mask + r, g + r, scale, n, st + 2 * r, none, none);
    input_grads<1>(dx + r, g + r, &dot, out_scale, n);
  }
}

template <typename T>
void scaled_masked_rows(int rows, float* const* y, const T* const* x, const float* const* mask, float scale,
                        int64_t n, float* st) {
  if (rows == 2) return scaled_masked_softmax_rows<2>(y, x, mask, scale, n, st);
  scaled_masked_softmax_rows<1>(y, x, mask, scale, n, st);
}

template <typename T>
void scaled_masked_rows_again(int rows, float* const* y, const T* const* x, const float* const* mask, float scale,
                              int64_t n, const float* st) {
  if (rows == 2) return scaled_masked_softmax_rows_again<2>(y, x, mask, scale, n, st);
  scaled_masked_softmax_rows_again<1>(y, x, mask, scale, n, st);
}

}  // namespace
}  // namespace lanes16

void softmax_rows_avx512(int rows, float* const* y, const float* const* x, int64_t n, float* m, float* inv) {
  switch (rows) {
    case 3: return lanes16::softmax_rows<3>(y, x, n, m, inv);
    case 2: return lanes16::softmax_rows<2>(y, x, n, m, inv);
    default: return lanes16::softmax_rows<1>(y, x, n, m, inv);
  }
}

void softmax_row_run_avx512(float* y, const float* x, int64_t rows, int64_t n) {
  lanes16::softmax_row_run(y, x, rows, n);
}

void log_softmax_row_avx512(float* y, const float* x, int64_t n) { lanes16::log_softmax_row(y, x, n); }

void log_softmax_backward_row_avx512(float* dx, const float* g, const float* y, int64_t n) {
  lanes16::log_softmax_backward_row(dx, g, y, n);
}

template <typename T>
void ScaledMaskedSoftmaxAvx512<T>::group(int rows, float* const* y, const T* const* x, const float* const* mask,
                                         float scale, int64_t n, float* st) {
  lanes16::scaled_masked_rows(rows, y, x, mask, scale, n, st);
}
template <typename T>
void ScaledMaskedSoftmaxAvx512<T>::group_again(int rows, float* const* y, const T* const* x,
                                               const float* const* mask, float scale, int64_t n, const float* st) {
  lanes16::scaled_masked_rows_again(rows, y, x, mask, scale, n, st);
}
template <typename T>
void ScaledMaskedSoftmaxAvx512<T>::run(int64_t rows, float* const* y, const T* const* x, const float* const* mask,
                                       float scale, int64_t n, float* st) {
  lanes16::scaled_masked_softmax_run(rows, y, x, mask, scale, n, st);
}
template <typename T>
void ScaledMaskedSoftmaxAvx512<T>::backward_run(int64_t rows, float* const* dx, const T* const* x,
                                                const float* const* mask, const float* const* g, float scale,
                                                float out_scale, int64_t n, const float* st) {
  lanes16::scaled_masked_softmax_backward_run(rows, dx, x, mask, g, scale, out_scale, n, st);
}
// Here only: no other file sees the definitions, so no other file can instantiate them.
template struct ScaledMaskedSoftmaxAvx512<float>;
template struct ScaledMaskedSoftmaxAvx512<BFloat16>;
template struct ScaledMaskedSoftmaxAvx512<Half>;

}  // namespace ember::cpu

#include "kernels/cpu/avx512_code_end.inc"
