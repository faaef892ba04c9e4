// Batch norm's plane walk on AVX-512 (kernels/cpu/batch_norm_planes_avx512.h). Everything after
// the target pragma is compiled for AVX-512 (and PREFETCHW, which every AVX-512 processor has)
// and lives in this file only, so no AVX-512 code can stand in for a function other files share.
#include "kernels/cpu/batch_norm_planes_avx512.h"

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/normalization_lanes.h"  // Sums2 only: no lane code of it is used here

// GCC 12 reports the _mm512_undefined_* placeholders inside its own intrinsics as
// maybe-uninitialized.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,prfchw")
#if defined(__clang__)  // clang ignores the GCC pragma; this is its equivalent
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,prfchw"))), apply_to = function)
#endif

namespace ember::cpu::batch_norm_planes {
namespace {

// ---- sums: a plane's double lanes in one zmm register (the 8-lane code's two ymm halves)

struct PlaneSums {
  __m512d sum, product;
};

// Eight elements of v and w: sum += v, product += v w (exact in double, so an FMA rounds as the
// 8-lane code's multiply and add do).
inline void add_step(PlaneSums& acc, __m256 v, __m256 w, bool same) {
  const __m512d vd = _mm512_cvtps_pd(v);
  const __m512d wd = same ? vd : _mm512_cvtps_pd(w);
  acc.sum = _mm512_add_pd(acc.sum, vd);
  acc.product = _mm512_fmadd_pd(vd, wd, acc.product);
}

// (t0 + t1) + (t2 + t3) of t = low half + high half, as the 8-lane code's hsum(s0 + s1).
inline double total(__m512d v) {
  const __m256d t = _mm256_add_pd(_mm512_castpd512_pd256(v), _mm512_extractf64x4_pd(v, 1));
  alignas(32) double l[4];
  _mm256_store_pd(l, t);
  return (l[0] + l[1]) + (l[2] + l[3]);
}

inline __mmask8 first8(int64_t n) { return __mmask8((1u << n) - 1); }

// R planes side by side (independent chains of adds), each in the 8-lane code's order: whole
// vectors of 8, then the last s % 8 elements padded with zeros. Every other step fetches a line
// `ahead` elements on (none when ahead is 0).
template <int R>
void planes_side_by_side(norm_lanes::Sums2* out, const float* v, const float* w, int64_t s, int64_t ahead) {
  const bool same = v == w;
  PlaneSums acc[R];
  for (int r = 0; r < R; ++r) acc[r] = {_mm512_setzero_pd(), _mm512_setzero_pd()};
  int64_t i = 0;
  for (; i + 8 <= s; i += 8) {
    if (ahead != 0 && i % 16 == 0)
      for (int r = 0; r < R; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(v + ahead + r * s + i), _MM_HINT_T0);
        if (!same) _mm_prefetch(reinterpret_cast<const char*>(w + ahead + r * s + i), _MM_HINT_T0);
      }
    for (int r = 0; r < R; ++r)
      add_step(acc[r], _mm256_loadu_ps(v + r * s + i), _mm256_loadu_ps(w + r * s + i), same);
  }
  if (i < s) {
    const __mmask8 m = first8(s - i);
    for (int r = 0; r < R; ++r)
      add_step(acc[r], _mm256_maskz_loadu_ps(m, v + r * s + i), _mm256_maskz_loadu_ps(m, w + r * s + i), same);
  }
  for (int r = 0; r < R; ++r) {
    out[r].a = total(acc[r].sum);
    out[r].b = total(acc[r].product);
  }
}

// ---- maps: each element by the 8-lane code's form for its place in its plane

struct Coefficients {
  __m512 a, b, d;
};

template <bool kPair>
inline __m512 whole_form(__m512 p, __m512 q, const Coefficients& k) {
  if constexpr (kPair) return _mm512_add_ps(_mm512_fmadd_ps(p, k.a, _mm512_mul_ps(q, k.b)), k.d);
  else return _mm512_fmadd_ps(p, k.a, k.d);
}
template <bool kPair>
inline __m512 last_form(__m512 p, __m512 q, const Coefficients& k) {
  if constexpr (kPair) return _mm512_add_ps(_mm512_fmadd_ps(q, k.b, _mm512_mul_ps(p, k.a)), k.d);
  else return _mm512_fmadd_ps(p, k.a, k.d);
}

inline __mmask16 lanes_from(int64_t count) {  // lanes >= count (count in [0, 16])
  return count >= 16 ? __mmask16(0) : count <= 0 ? __mmask16(0xFFFF) : __mmask16(0xFFFFu << count);
}

// Vectors at the 64-byte boundaries of out (each store one whole cache line); a vector that
// meets a plane's end takes each lane's form and coefficients from its own place. Each whole
// vector claims the line `ahead` elements on for writing (none when ahead is 0).
template <bool kPair>
void map_range(float* out, const float* p, const float* q, int64_t pb, int64_t pe, int64_t s, int64_t channels,
               const float* a, const float* b, const float* d, int64_t ahead) {
  const auto coefficients = [&](int64_t plane) {
    const int64_t c = plane % channels;
    return Coefficients{_mm512_set1_ps(a[c]), _mm512_set1_ps(kPair ? b[c] : 0.0f), _mm512_set1_ps(d[c])};
  };
  const int64_t first = pb * s, stop = pe * s;
  int64_t e = first - int64_t((reinterpret_cast<uintptr_t>(out + first) % 64) / sizeof(float));
  int64_t plane = pb, end = (pb + 1) * s, last_begin = end - s % 8;
  Coefficients k = coefficients(plane), next = coefficients(plane + 1);
  while (e < stop) {
    if (e >= first && e + 16 <= last_begin) {
      if (ahead != 0) __builtin_prefetch(out + ahead + e, 1);  // for writing: prefetchw
      const __m512 pv = _mm512_loadu_ps(p + e);
      _mm512_storeu_ps(out + e, whole_form<kPair>(pv, kPair ? _mm512_loadu_ps(q + e) : pv, k));
      e += 16;
      continue;
    }
    const __mmask16 valid = __mmask16(lanes_from(first - e) & ~lanes_from(stop - e));
    const __m512 pv = _mm512_maskz_loadu_ps(valid, p + e);
    const __m512 qv = kPair ? _mm512_maskz_loadu_ps(valid, q + e) : pv;
    const __m512 own =
        _mm512_mask_blend_ps(lanes_from(last_begin - e), whole_form<kPair>(pv, qv, k), last_form<kPair>(pv, qv, k));
    _mm512_mask_storeu_ps(out + e, valid,
                          _mm512_mask_blend_ps(lanes_from(end - e), own, whole_form<kPair>(pv, qv, next)));
    e += 16;
    if (e >= end) {
      ++plane;
      end += s;
      last_begin = end - s % 8;
      k = next;
      next = coefficients(plane + 1);
    }
  }
}

}  // namespace

void plane_pair_sums_avx512(norm_lanes::Sums2* out, const float* v, const float* w, int64_t planes, int64_t s,
                            int64_t ahead) {
  int64_t p = 0;
  for (; p + 2 <= planes; p += 2) planes_side_by_side<2>(out + p, v + p * s, w + p * s, s, ahead);
  if (p < planes) planes_side_by_side<1>(out + p, v + p * s, w + p * s, s, ahead);
}

void map_planes_avx512(float* out, const float* p, const float* q, int64_t pb, int64_t pe, int64_t s,
                       int64_t channels, const float* a, const float* b, const float* d, int64_t ahead) {
  if (q) map_range<true>(out, p, q, pb, pe, s, channels, a, b, d, ahead);
  else map_range<false>(out, p, nullptr, pb, pe, s, channels, a, nullptr, d, ahead);
}

}  // namespace ember::cpu::batch_norm_planes

#if defined(__clang__)
#pragma clang attribute pop
#endif
#pragma GCC pop_options
#pragma GCC diagnostic pop
