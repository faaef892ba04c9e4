// Batch norm's per-channel affine maps over whole f32 planes ([n, c, s] with s >= 16), walked
// as one flat run: a vector that crosses from one plane into the next takes each lane's own
// channel coefficients, so only the range's last plane ends in partial vectors.
//
// The float forms are spelled with explicit FMAs, matching what the compiler made of the
// per-plane loops they replace (results keep their bits): out = p a + d; with a second operand,
// out = fma(p, a, q b) + d in a plane's whole vectors and fma(q, b, p a) + d in its last s % 8
// elements.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace ember::cpu::batch_norm_planes {

struct Coefficients {
  __m256 a, b, d;
};

inline __m256 lanes_below(int64_t count) {
  return _mm256_castsi256_ps(
      _mm256_cmpgt_epi32(_mm256_set1_epi32(int(count)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
}

template <bool kPair>
inline __m256 whole_form(__m256 p, __m256 q, const Coefficients& k) {
  if constexpr (kPair) return _mm256_add_ps(_mm256_fmadd_ps(p, k.a, _mm256_mul_ps(q, k.b)), k.d);
  else return _mm256_fmadd_ps(p, k.a, k.d);
}
template <bool kPair>
inline __m256 last_form(__m256 p, __m256 q, const Coefficients& k) {
  if constexpr (kPair) return _mm256_add_ps(_mm256_fmadd_ps(q, k.b, _mm256_mul_ps(p, k.a)), k.d);
  else return _mm256_fmadd_ps(p, k.a, k.d);
}

// out = map(p, q) over planes [pb, pe) of s elements; plane i has channel i % channels and
// coefficients a, b, d of that channel (b and q unused unless kPair).
template <bool kPair>
void map_planes(float* out, const float* p, const float* q, int64_t pb, int64_t pe, int64_t s, int64_t channels,
                const float* a, const float* b, const float* d) {
  const auto coefficients = [&](int64_t plane) {
    const int64_t c = plane % channels;
    return Coefficients{_mm256_set1_ps(a[c]), _mm256_set1_ps(kPair ? b[c] : 0.0f), _mm256_set1_ps(d[c])};
  };
  const auto load_q = [&](int64_t e) { return kPair ? _mm256_loadu_ps(q + e) : _mm256_setzero_ps(); };
  int64_t e = pb * s;
  for (int64_t plane = pb; plane < pe; ++plane) {
    const int64_t end = (plane + 1) * s, last_begin = end - s % 8;
    const Coefficients k = coefficients(plane);
    for (; e + 8 <= last_begin; e += 8)
      _mm256_storeu_ps(out + e, whole_form<kPair>(_mm256_loadu_ps(p + e), load_q(e), k));
    if (plane + 1 == pe) {  // the range's end: whole form, then masked last elements
      if (e < last_begin) {
        const __m256i m = _mm256_castps_si256(lanes_below(last_begin - e));
        const __m256 pv = _mm256_maskload_ps(p + e, m), qv = kPair ? _mm256_maskload_ps(q + e, m) : pv;
        _mm256_maskstore_ps(out + e, m, whole_form<kPair>(pv, qv, k));
        e = last_begin;
      }
      if (e < end) {
        const __m256i m = _mm256_castps_si256(lanes_below(end - e));
        const __m256 pv = _mm256_maskload_ps(p + e, m), qv = kPair ? _mm256_maskload_ps(q + e, m) : pv;
        _mm256_maskstore_ps(out + e, m, last_form<kPair>(pv, qv, k));
        e = end;
      }
      break;
    }
    // vectors over this plane's last elements and the next plane's first: each lane's form
    const Coefficients next = coefficients(plane + 1);
    for (; e < end; e += 8) {
      const __m256 pv = _mm256_loadu_ps(p + e), qv = load_q(e);
      const __m256 own =
          _mm256_blendv_ps(last_form<kPair>(pv, qv, k), whole_form<kPair>(pv, qv, k), lanes_below(last_begin - e));
      _mm256_storeu_ps(out + e, _mm256_blendv_ps(whole_form<kPair>(pv, qv, next), own, lanes_below(end - e)));
    }
  }
}

}  // namespace ember::cpu::batch_norm_planes
