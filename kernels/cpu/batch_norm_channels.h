// Batch norm's plane walk over a contiguous [n, c, s] input whose planes (s >= kPlaneMin
// elements) are runs of one channel: each plane's sums, a channel's totals from them, the
// per-channel statistics and backward coefficients, and the per-channel affine maps over a range
// of planes. The pieces (normalization_batch_norm.cpp) and the one-pass kernels
// (normalization_batch_norm_fused.cpp) both compute through these, so they give the same bits.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/cpu_features.h"
#include "core/native/normalization.h"
#include "kernels/cpu/batch_norm_planes_avx512.h"
#include "kernels/cpu/normalization_lanes.h"
#if defined(__AVX2__) && defined(__FMA__)
#include "kernels/cpu/batch_norm_planes.h"
#endif

namespace ember::cpu::batch_norm_channels {

namespace nl = norm_lanes;
using native::ChannelGeometry;

constexpr int64_t kPlaneMin = 32;
constexpr int64_t kTaskElements = 16384;  // elements per parallel task, about

// Planes per chunk of a channel's total: the chunks' sums are added in order.
inline int64_t planes_per_chunk(int64_t s) { return std::max<int64_t>(1, kTaskElements / s); }

// out[p - pb] = {sum v, sum v * w} over plane p, for the planes [pb, pe) of s elements. A plane's
// sums are the same bits alone or beside its neighbour, and on either instruction set.
template <typename T>
void plane_pair_sums(nl::Sums2* out, const T* v, const T* w, int64_t pb, int64_t pe, int64_t s) {
  if constexpr (std::is_same_v<T, float>) {
    if (cpu_capability() == CpuCapability::Avx512)
      return batch_norm_planes::plane_pair_sums_avx512(out, v + pb * s, w + pb * s, pe - pb, s);
  }
  int64_t p = pb;
  if constexpr (std::is_same_v<T, float>)  // two planes at a time: independent add chains
    for (; p + 2 <= pe; p += 2) nl::adjacent_pair_sums<2, true>(v + p * s, w + p * s, s, out + (p - pb));
  for (; p < pe; ++p) out[p - pb] = nl::run_pair_sums(v + p * s, w + p * s, s);
}

// A channel's totals from the sums of its n planes (first[i * stride] for sample i): fixed
// chunks of planes added in order, and the chunks added in order.
inline nl::Sums2 channel_total(const nl::Sums2* first, int64_t stride, int64_t n, int64_t s) {
  const int64_t per_chunk = planes_per_chunk(s);
  nl::Sums2 total;
  for (int64_t k = 0; k * per_chunk < n; ++k) {
    nl::Sums2 acc;
    for (int64_t i = k * per_chunk; i < std::min(n, (k + 1) * per_chunk); ++i) {
      const nl::Sums2& r = first[i * stride];
      acc.a += r.a;
      acc.b += r.b;
    }
    total.a += acc.a;
    total.b += acc.b;
  }
  return total;
}

// Running statistics of one channel: moved towards the batch mean and the unbiased variance.
template <typename A>
struct RunningStats {
  A* mean = nullptr;  // both null, or both given
  A* var = nullptr;
  double momentum = 0;
};
template <typename A>
RunningStats<A> running_stats(const Tensor& mean, const Tensor& var, double momentum) {
  return {mean.defined() ? mean.data_ptr<A>() : nullptr, var.defined() ? var.data_ptr<A>() : nullptr, momentum};
}

// mean[c] and invstd[c] from a channel's sum and sum of squares over `count` values, and the
// running statistics' update.
template <typename A>
void gather_channel(A* mean, A* invstd, const RunningStats<A>& running, int64_t c, double sum, double sumsq,
                    double count, double eps) {
  const double m = sum / count;
  const double var = std::max(0.0, sumsq / count - m * m);
  mean[c] = A(m);
  invstd[c] = A(1.0 / std::sqrt(var + eps));
  const double momentum = running.momentum;
  if (running.mean) running.mean[c] = A((1 - momentum) * double(running.mean[c]) + momentum * m);
  if (running.var) running.var[c] = A((1 - momentum) * double(running.var[c]) + momentum * var * count / (count - 1));
}

// The forward map of channel c, y = x * scale + shift: scale = invstd w, shift = b - mean scale
// (w and b may be null: ones and zeros).
template <typename A>
void forward_coefficients(A* scale, A* shift, int64_t c, const A* mean, const A* invstd, const A* w, const A* b) {
  scale[c] = invstd[c] * (w ? w[c] : A(1));
  shift[c] = (b ? b[c] : A(0)) - mean[c] * scale[c];
}

// The backward map of channel c, dx = dy a + x b + d (see batch_norm_backward_elemt_stub): with
// a = invstd w and k = invstd^2 sum_dy_xmu / count, b = -k a and d = (mean k - sum_dy / count) a.
// sum_dy and sum_dy_xmu null: the fixed-statistics gradient dy a.
template <typename A>
void backward_coefficients(A* ca, A* cb, A* cd, int64_t c, const A* mean, const A* invstd, const A* w,
                           const double* sum_dy, const double* sum_dy_xmu, double count) {
  const double a = double(invstd[c]) * (w ? double(w[c]) : 1.0);
  const double k = sum_dy_xmu ? double(invstd[c]) * double(invstd[c]) * sum_dy_xmu[c] / count : 0.0;
  const double mdy = sum_dy ? sum_dy[c] / count : 0.0;
  ca[c] = A(a);
  cb[c] = A(-k * a);
  cd[c] = A((double(mean[c]) * k - mdy) * a);
}

// out = p * a[c] + q * b[c] + d[c] over the planes [pb, pe) (plane i has channel i % g.c); q
// null: out = p * a[c] + d[c] (b unused). A plane's values do not depend on the range it is
// mapped in, nor on the instruction set.
template <typename T, typename A>
void map_plane_range(T* out, const T* p, const T* q, const A* a, const A* b, const A* d, int64_t pb, int64_t pe,
                     const ChannelGeometry& g) {
  if constexpr (std::is_same_v<T, float> && std::is_same_v<A, float>) {
    if (cpu_capability() == CpuCapability::Avx512)
      return batch_norm_planes::map_planes_avx512(out, p, q, pb, pe, g.s, g.c, a, b, d);
  }
#if defined(__AVX2__) && defined(__FMA__)
  if constexpr (std::is_same_v<T, float> && std::is_same_v<A, float>) {
    if (q) batch_norm_planes::map_planes<true>(out, p, q, pb, pe, g.s, g.c, a, b, d);
    else batch_norm_planes::map_planes<false>(out, p, nullptr, pb, pe, g.s, g.c, a, nullptr, d);
    return;
  }
#endif
  for (int64_t i = pb; i < pe; ++i) {
    const int64_t c = i % g.c, off = i * g.s;
    if (q) nl::combine(out + off, p + off, q + off, g.s, a[c], b[c], d[c]);
    else nl::scale_shift(out + off, p + off, g.s, a[c], d[c]);
  }
}

}  // namespace ember::cpu::batch_norm_channels
