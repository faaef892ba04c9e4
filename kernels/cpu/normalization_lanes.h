// Contiguous-run primitives of the batch, group and RMS norm CPU kernels: sums in double lanes
// and per-run affine maps, one body for every floating storage type. f32, bf16 and f16 runs are
// loaded as 8 float lanes (vec_half.h) and their sums widened to double lanes: a product of two
// floats is exact in double, so sum(x^2) - n mean^2 keeps its accuracy for data whose mean is
// large against its spread. f64 runs use plain loops the compiler vectorises.
// Also what those kernels share on the host side (optional operands).
#pragma once
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/half.h"
#include "core/tensor.h"
#include "kernels/cpu/vec_half.h"

namespace ember::cpu::norm_lanes {

using vec8::f8;
using vec8::kLanes;
using d4 = double __attribute__((vector_size(32)));

// The elements of an optional operand, or null when it is undefined.
template <typename A>
const A* data_or_null(const Tensor& t) {
  return t.defined() ? t.data_ptr<A>() : nullptr;
}

struct Sums2 {
  double a = 0, b = 0;
};

// Widening halves: spelled as one vcvtps2pd each, which the generic convert left as two
// 128-bit converts and an insert (the sums' bottleneck).
#if defined(__AVX__)
inline d4 low_half(f8 v) {
  return std::bit_cast<d4>(_mm256_cvtps_pd(_mm256_castps256_ps128(std::bit_cast<__m256>(v))));
}
inline d4 high_half(f8 v) {
  return std::bit_cast<d4>(_mm256_cvtps_pd(_mm256_extractf128_ps(std::bit_cast<__m256>(v), 1)));
}
#else
inline d4 low_half(f8 v) { return __builtin_convertvector(__builtin_shufflevector(v, v, 0, 1, 2, 3), d4); }
inline d4 high_half(f8 v) { return __builtin_convertvector(__builtin_shufflevector(v, v, 4, 5, 6, 7), d4); }
#endif
inline double hsum(d4 v) { return (v[0] + v[1]) + (v[2] + v[3]); }

// 8 elements from i (fewer at the tail, the rest zero) as float lanes.
template <typename T>
inline f8 load(const T* p, int64_t i, int64_t n) {
  return i + kLanes <= n ? vec8::load8(p + i) : vec8::load_part(p + i, n - i, 0.0f);
}
template <typename T>
inline void store(T* p, int64_t i, int64_t n, f8 v) {
  if (i + kLanes <= n) vec8::store8(p + i, v);
  else vec8::store_part(p + i, v, n - i);
}

// load() for the sums: f32 tails as one masked load (batch norm's 14x14 planes end in a tail
// every 25 vectors). Only for sums, whose bits cannot change with the code's shape: the maps'
// float expressions are left exactly as they are compiled today.
#if defined(__AVX2__)
inline __m256i tail_mask(int64_t count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(count)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
#endif
template <typename T>
inline f8 load_for_sum(const T* p, int64_t i, int64_t n) {
#if defined(__AVX2__)
  if constexpr (std::is_same_v<T, float>)
    if (i + kLanes > n) return std::bit_cast<f8>(_mm256_maskload_ps(p + i, tail_mask(n - i)));
#endif
  return load(p, i, n);
}

// dst[k] += v[k] for k < count (<= 8), in double.
inline void add_lanes(double* dst, f8 v, int64_t count) {
  if (count == kLanes) {
    d4 lo, hi;
    std::memcpy(&lo, dst, sizeof lo);
    std::memcpy(&hi, dst + 4, sizeof hi);
    lo += low_half(v);
    hi += high_half(v);
    std::memcpy(dst, &lo, sizeof lo);
    std::memcpy(dst + 4, &hi, sizeof hi);
  } else {
    for (int64_t k = 0; k < count; ++k) dst[k] += double(v[k]);
  }
}

// {sum v(i), sum v(i) * w(i)} over i < n, where v and w give float lanes; accumulated in double.
template <typename V, typename W>
inline Sums2 pair_sums(int64_t n, const V& v, const W& w) {
  d4 s0{}, s1{}, p0{}, p1{};
  for (int64_t i = 0; i < n; i += kLanes) {
    const f8 a = v(i), b = w(i);
    const d4 alo = low_half(a), ahi = high_half(a);
    s0 += alo;
    s1 += ahi;
    p0 += alo * low_half(b);
    p1 += ahi * high_half(b);
  }
  return {hsum(s0 + s1), hsum(p0 + p1)};
}

// pair_sums of kRuns runs side by side: v(r, i) and w(r, i) give run r's lanes. Each run's
// adds keep pair_sums' order (the same bits); the runs' independent chains hide the adds'
// latency, which bounds a single run. kWithA false leaves the plain sums out (a = 0).
template <int kRuns, bool kWithA, typename V, typename W>
inline void pair_sums_side_by_side(int64_t n, const V& v, const W& w, Sums2* out) {
  d4 s0[kRuns] = {}, s1[kRuns] = {}, p0[kRuns] = {}, p1[kRuns] = {};
  for (int64_t i = 0; i < n; i += kLanes)
    for (int r = 0; r < kRuns; ++r) {
      const f8 a = v(r, i), b = w(r, i);
      const d4 alo = low_half(a), ahi = high_half(a);
      if constexpr (kWithA) {
        s0[r] += alo;
        s1[r] += ahi;
      }
      p0[r] += alo * low_half(b);
      p1[r] += ahi * high_half(b);
    }
  for (int r = 0; r < kRuns; ++r) out[r] = {kWithA ? hsum(s0[r] + s1[r]) : 0.0, hsum(p0[r] + p1[r])};
}

// run_pair_sums of kRuns adjacent f32 runs of n elements (v + r n and w + r n).
template <int kRuns, bool kWithA>
inline void adjacent_pair_sums(const float* v, const float* w, int64_t n, Sums2* out) {
  if (v == w) {
    const auto lanes = [&](int r, int64_t i) { return load_for_sum(v + r * n, i, n); };
    pair_sums_side_by_side<kRuns, kWithA>(n, lanes, lanes, out);
  } else {
    pair_sums_side_by_side<kRuns, kWithA>(n, [&](int r, int64_t i) { return load_for_sum(v + r * n, i, n); },
                                          [&](int r, int64_t i) { return load_for_sum(w + r * n, i, n); }, out);
  }
}

// {sum v, sum v * w} over one run.
template <typename T>
inline Sums2 run_pair_sums(const T* v, const T* w, int64_t n) {
  if constexpr (std::is_same_v<T, double>) {
    double s[4] = {}, q[4] = {};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
      for (int k = 0; k < 4; ++k) s[k] += v[i + k], q[k] += v[i + k] * w[i + k];
    for (; i < n; ++i) s[0] += v[i], q[0] += v[i] * w[i];
    return {(s[0] + s[1]) + (s[2] + s[3]), (q[0] + q[1]) + (q[2] + q[3])};
  } else {
    if (v == w) {  // sum and sum of squares: one load and one widening per element
      const auto lanes = [&](int64_t i) { return load_for_sum(v, i, n); };
      return pair_sums(n, lanes, lanes);
    }
    return pair_sums(n, [&](int64_t i) { return load_for_sum(v, i, n); },
                     [&](int64_t i) { return load_for_sum(w, i, n); });
  }
}

// pa[i] += v[i], pb[i] += v[i] * w[i] (double partial sums).
template <typename T>
inline void add_run_pairs(double* pa, double* pb, const T* v, const T* w, int64_t n) {
  if constexpr (std::is_same_v<T, double>) {
    for (int64_t i = 0; i < n; ++i) pa[i] += v[i], pb[i] += v[i] * w[i];
  } else {
    for (int64_t i = 0; i < n; i += kLanes) {
      const f8 a = load(v, i, n), b = load(w, i, n);
      const int64_t count = std::min<int64_t>(kLanes, n - i);
      add_lanes(pa + i, a, count);
      // the product of two floats is exact in double: widen before multiplying
      if (count == kLanes) {
        d4 lo, hi;
        std::memcpy(&lo, pb + i, sizeof lo);
        std::memcpy(&hi, pb + i + 4, sizeof hi);
        lo += low_half(a) * low_half(b);
        hi += high_half(a) * high_half(b);
        std::memcpy(pb + i, &lo, sizeof lo);
        std::memcpy(pb + i + 4, &hi, sizeof hi);
      } else {
        for (int64_t k = 0; k < count; ++k) pb[i + k] += double(a[k]) * double(b[k]);
      }
    }
  }
}

// y = x * a + b.
template <typename T, typename A>
inline void scale_shift(T* y, const T* x, int64_t n, A a, A b) {
  if constexpr (std::is_same_v<T, double>) {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * a + b;
  } else {
    for (int64_t i = 0; i < n; i += kLanes) store(y, i, n, load(x, i, n) * float(a) + float(b));
  }
}

// out = p * a + q * b + c per element, coefficients given per element (arrays of n).
template <typename T, typename A>
inline void combine_arrays(T* out, const T* p, const T* q, int64_t n, const A* a, const A* b, const A* c) {
  if constexpr (std::is_same_v<T, double>) {
    for (int64_t i = 0; i < n; ++i) out[i] = p[i] * a[i] + q[i] * b[i] + c[i];
  } else {
    for (int64_t i = 0; i < n; i += kLanes)
      store(out, i, n, load(p, i, n) * load(a, i, n) + load(q, i, n) * load(b, i, n) + load(c, i, n));
  }
}

// dx = dy * a + x * b + c.
template <typename T, typename A>
inline void combine(T* dx, const T* dy, const T* x, int64_t n, A a, A b, A c) {
  if constexpr (std::is_same_v<T, double>) {
    for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * a + x[i] * b + c;
  } else {
    for (int64_t i = 0; i < n; i += kLanes)
      store(dx, i, n, load(dy, i, n) * float(a) + load(x, i, n) * float(b) + float(c));
  }
}

// y = x * a * w (w may be null: ones).
template <typename T, typename A>
inline void scale_weighted(T* y, const T* x, int64_t n, A a, const A* w) {
  if constexpr (std::is_same_v<T, double>) {
    if (w) {
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] * a * w[i];
    } else {
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] * a;
    }
  } else {
    for (int64_t i = 0; i < n; i += kLanes) {
      const f8 v = load(x, i, n) * float(a);
      store(y, i, n, w ? v * load(w, i, n) : v);
    }
  }
}

}  // namespace ember::cpu::norm_lanes
