// 16-lane GELU row loops (kernels/cpu/gelu_avx512.h). Everything after the target pragma is
// compiled for AVX-512 and lives in this file only (the formulas are included into an
// unnamed namespace), so no AVX-512 code can stand in for a function other files share.
#include "kernels/cpu/gelu_avx512.h"

#include <immintrin.h>

#include <cstdint>

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

#include "kernels/cpu/exp_lanes.inc"

// e^x as vec8::exp8: the same clamps, then the same steps. _mm512_max_ps / min_ps return their
// second operand for NaN, as the 8-lane ones do.
EMBER_LANES_INLINE Lanes exp_lanes(Lanes x) {
  return exp_clamped_lanes(lanes(_mm512_min_ps(_mm512_set1_ps(88.0f), _mm512_max_ps(_mm512_set1_ps(-88.0f), raw(x)))));
}

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

template <bool Tanh, typename T>
void forward_row(T* y, const T* x, const float* bias, int64_t n) {
  for (int64_t i = 0; i < n; i += kWidth) {
    const int64_t k = n - i;
    Lanes v = load(x + i, k);
    if (bias) v = v + load(bias + i, k);
    store(y + i, act<Tanh>(v), k);
  }
}

template <bool Tanh, typename D, typename T>
void backward_row(D* d, const T* g, const T* x, const float* bias, int64_t n) {
  for (int64_t i = 0; i < n; i += kWidth) {
    const int64_t k = n - i;
    Lanes v = load(x + i, k);
    if (bias) v = v + load(bias + i, k);
    store(d + i, load(g + i, k) * act_grad<Tanh>(v), k);
  }
}

}  // namespace

void gelu_forward_row_avx512(float* y, const float* x, const float* bias, int64_t n, bool tanh_approx) {
  tanh_approx ? forward_row<true>(y, x, bias, n) : forward_row<false>(y, x, bias, n);
}
void gelu_forward_row_avx512(BFloat16* y, const BFloat16* x, const float* bias, int64_t n, bool tanh_approx) {
  tanh_approx ? forward_row<true>(y, x, bias, n) : forward_row<false>(y, x, bias, n);
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
