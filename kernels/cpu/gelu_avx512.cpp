// 16-lane GELU row loops (kernels/cpu/gelu_avx512.h). Everything after the target pragma is
// compiled for AVX-512 and lives in this file only (the formulas are included into an
// unnamed namespace), so no AVX-512 code can stand in for a function other files share.
#include "kernels/cpu/gelu_avx512.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/half.h"
#include "kernels/cpu/vec8.h"  // EMBER_LANES_INLINE only: no lane code of it is used here

#include "kernels/cpu/avx512_code_begin.inc"

namespace ember::cpu {
namespace {

using Lanes = float __attribute__((vector_size(64)));
using ULanes = uint32_t __attribute__((vector_size(64)));
constexpr int64_t kWidth = 16;

inline __m512 raw(Lanes v) { return __builtin_bit_cast(__m512, v); }
inline Lanes lanes(__m512 v) { return __builtin_bit_cast(Lanes, v); }

EMBER_LANES_INLINE Lanes fma_lanes(Lanes a, Lanes b, Lanes c) { return lanes(_mm512_fmadd_ps(raw(a), raw(b), raw(c))); }
// min(hi, x) and max(lo, x) that return a NaN x as is, as vec8's do
EMBER_LANES_INLINE Lanes min_lanes(float hi, Lanes x) { return lanes(_mm512_min_ps(_mm512_set1_ps(hi), raw(x))); }
EMBER_LANES_INLINE Lanes max_lanes(float lo, Lanes x) { return lanes(_mm512_max_ps(_mm512_set1_ps(lo), raw(x))); }
// min(hi, |x|) in one instruction: imm 0b1010 picks the operand of smaller magnitude and clears
// its sign; a NaN x comes back a NaN
EMBER_LANES_INLINE Lanes abs_min_lanes(float hi, Lanes x) { return lanes(_mm512_range_ps(raw(x), _mm512_set1_ps(hi), 0b1010)); }

#include "kernels/cpu/exp_lanes.inc"

#include "kernels/cpu/gelu_lanes.inc"

// ---- loads and stores of the first n <= 16 elements (the rest read as 0, not written)

inline __mmask16 first(int64_t n) { return n >= kWidth ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1); }

inline Lanes load(const float* p, int64_t n) { return lanes(_mm512_maskz_loadu_ps(first(n), p)); }
inline Lanes load(const BFloat16* p, int64_t n) {
  const __m256i h = _mm256_maskz_loadu_epi16(first(n), p);
  return lanes(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
}
inline void store(float* p, Lanes v, int64_t n) { _mm512_mask_storeu_ps(p, first(n), raw(v)); }
// Round to nearest even, NaN kept a quiet NaN (BFloat16::from_float).
inline void store(BFloat16* p, Lanes v, int64_t n) {
  const ULanes u = __builtin_bit_cast(ULanes, v);
  const ULanes rounded = (u + (0x7fffu + ((u >> 16) & 1u))) >> 16;
  const ULanes quiet = (u >> 16) | 0x40u;
  const ULanes r = (u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded;
  _mm256_mask_storeu_epi16(p, first(n), _mm512_cvtepi32_epi16(__builtin_bit_cast(__m512i, r)));
}

template <bool Tanh>
EMBER_LANES_INLINE Lanes act(Lanes v) {
  if constexpr (Tanh) return gelu_tanh_lanes(v);
  else return gelu_lanes(v);
}
template <bool Tanh>
EMBER_LANES_INLINE Lanes act_grad(Lanes v) {
  if constexpr (Tanh) return gelu_tanh_grad_lanes(v);
  else return gelu_grad_lanes(v);
}

// Stores of whole vectors: ordinary, or non-temporal (p 64-byte aligned) for a streamed output.
template <bool Stream>
inline void store_whole(float* p, Lanes v) {
  if constexpr (Stream) _mm512_stream_ps(p, raw(v));
  else _mm512_storeu_ps(p, raw(v));
}
template <bool Stream>
inline void store_whole(BFloat16* p, Lanes v) {
  static_assert(!Stream, "bf16 rows are not streamed");
  store(p, v, kWidth);
}

// Elements i .. end - 1, whole vectors two at a time (two independent chains for the scheduler,
// no per-vector masks), the rest masked; returns end.
template <bool Tanh, bool Stream, typename T>
int64_t forward_span(T* y, const T* x, const float* bias, int64_t i, int64_t end) {
  for (; i + 2 * kWidth <= end; i += 2 * kWidth) {
    // a streamed row is a long one: the hardware prefetchers stop at each 4 KiB page, this
    // keeps the next page's lines coming
    if constexpr (Stream) _mm_prefetch(reinterpret_cast<const char*>(x + i + 1024), _MM_HINT_T0);
    Lanes a = load(x + i, kWidth), b = load(x + i + kWidth, kWidth);
    if (bias) {
      a = a + load(bias + i, kWidth);
      b = b + load(bias + i + kWidth, kWidth);
    }
    store_whole<Stream>(y + i, act<Tanh>(a));
    store_whole<Stream>(y + i + kWidth, act<Tanh>(b));
  }
  for (; i < end; i += kWidth) {
    const int64_t k = end - i;
    Lanes v = load(x + i, k);
    if (bias) v = v + load(bias + i, k);
    store(y + i, act<Tanh>(v), k);
  }
  return end;
}

template <bool Tanh, typename T>
void forward_row(T* y, const T* x, const float* bias, int64_t n, bool stream) {
  if constexpr (std::is_same_v<T, float>) {
    const auto addr = reinterpret_cast<uintptr_t>(y);
    if (stream && addr % sizeof(float) == 0) {
      // up to the first 64-byte boundary with ordinary stores, the whole lines streamed, the
      // last partial line ordinary; the fence orders the streamed stores before whatever
      // tells another thread the row is done
      const int64_t head = std::min<int64_t>(n, int64_t((64 - addr % 64) % 64 / sizeof(float)));
      const int64_t body_end = head + (n - head) / kWidth * kWidth;
      forward_span<Tanh, false>(y, x, bias, 0, head);
      forward_span<Tanh, true>(y, x, bias, head, body_end);
      forward_span<Tanh, false>(y, x, bias, body_end, n);
      _mm_sfence();
      return;
    }
  }
  forward_span<Tanh, false>(y, x, bias, 0, n);
}

template <bool Tanh, typename D, typename T>
void backward_row(D* d, const T* g, const T* x, const float* bias, int64_t n) {
  int64_t i = 0;
  for (; i + 2 * kWidth <= n; i += 2 * kWidth) {
    Lanes a = load(x + i, kWidth), b = load(x + i + kWidth, kWidth);
    if (bias) {
      a = a + load(bias + i, kWidth);
      b = b + load(bias + i + kWidth, kWidth);
    }
    store(d + i, load(g + i, kWidth) * act_grad<Tanh>(a), kWidth);
    store(d + i + kWidth, load(g + i + kWidth, kWidth) * act_grad<Tanh>(b), kWidth);
  }
  for (; i < n; i += kWidth) {
    const int64_t k = n - i;
    Lanes v = load(x + i, k);
    if (bias) v = v + load(bias + i, k);
    store(d + i, load(g + i, k) * act_grad<Tanh>(v), k);
  }
}

}  // namespace

void gelu_forward_row_avx512(float* y, const float* x, const float* bias, int64_t n, bool tanh_approx,
                             bool stream) {
  tanh_approx ? forward_row<true>(y, x, bias, n, stream) : forward_row<false>(y, x, bias, n, stream);
}
void gelu_forward_row_avx512(BFloat16* y, const BFloat16* x, const float* bias, int64_t n, bool tanh_approx) {
  tanh_approx ? forward_row<true>(y, x, bias, n, false) : forward_row<false>(y, x, bias, n, false);
}
void gelu_backward_row_avx512(float* d, const float* g, const float* x, const float* bias, int64_t n,
                              bool tanh_approx) {
  tanh_approx ? backward_row<true>(d, g, x, bias, n) : backward_row<false>(d, g, x, bias, n);
}
void gelu_backward_row_avx512(float* d, const BFloat16* g, const BFloat16* x, const float* bias, int64_t n,
                              bool tanh_approx) {
  tanh_approx ? backward_row<true>(d, g, x, bias, n) : backward_row<false>(d, g, x, bias, n);
}
void gelu_backward_row_avx512(BFloat16* d, const BFloat16* g, const BFloat16* x, const float* bias, int64_t n,
                              bool tanh_approx) {
  tanh_approx ? backward_row<true>(d, g, x, bias, n) : backward_row<false>(d, g, x, bias, n);
}

}  // namespace ember::cpu

#include "kernels/cpu/avx512_code_end.inc"
