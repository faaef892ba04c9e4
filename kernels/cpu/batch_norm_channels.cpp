// Batch norm's plane walk (kernels/cpu/batch_norm_channels.h), compiled once for the pieces and
// the one-pass kernels alike.
#include "kernels/cpu/batch_norm_channels.h"

#include <cmath>
#include <type_traits>

#include "core/cpu_features.h"
#include "core/half.h"
#include "kernels/cpu/batch_norm_planes_avx512.h"
#if defined(__AVX2__) && defined(__FMA__)
#include "kernels/cpu/batch_norm_planes.h"
#endif

namespace ember::cpu::batch_norm_channels {

namespace {

// Asks for the elements [first, first + count) of v to be fetched.
template <typename T>
void prefetch_elements(const T* v, int64_t first, int64_t count) {
  const char* begin = reinterpret_cast<const char*>(v + first);
  for (int64_t o = 0; o < count * int64_t(sizeof(T)); o += 64) __builtin_prefetch(begin + o, 0, 3);
}

}  // namespace

template <typename T>
void plane_pair_sums(nl::Sums2* out, const T* v, const T* w, int64_t pb, int64_t pe, int64_t s, int64_t ahead) {
  if constexpr (std::is_same_v<T, float>) {
    if (cpu_capability() == CpuCapability::Avx512)
      return batch_norm_planes::plane_pair_sums_avx512(out, v + pb * s, w + pb * s, pe - pb, s, ahead);
  }
  if (ahead != 0) {
    prefetch_elements(v, pb * s + ahead, (pe - pb) * s);
    if (w != v) prefetch_elements(w, pb * s + ahead, (pe - pb) * s);
  }
  int64_t p = pb;
  if constexpr (std::is_same_v<T, float>)  // two planes at a time: independent add chains
    for (; p + 2 <= pe; p += 2) nl::adjacent_pair_sums<2, true>(v + p * s, w + p * s, s, out + (p - pb));
  for (; p < pe; ++p) out[p - pb] = nl::run_pair_sums(v + p * s, w + p * s, s);
}

nl::Sums2 channel_total(const nl::Sums2* first, int64_t stride, int64_t n, int64_t s) {
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

template <typename A>
void forward_coefficients(A* scale, A* shift, int64_t c, const A* mean, const A* invstd, const A* w, const A* b) {
  scale[c] = invstd[c] * (w ? w[c] : A(1));
  shift[c] = (b ? b[c] : A(0)) - mean[c] * scale[c];
}

double centred_product_sum(double sum_dy_x, double mean, double sum_dy) { return sum_dy_x - mean * sum_dy; }

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

template <typename T, typename A>
void map_plane_range(T* out, const T* p, const T* q, const A* a, const A* b, const A* d, int64_t pb, int64_t pe,
                     const ChannelGeometry& g, int64_t ahead) {
  if constexpr (std::is_same_v<T, float> && std::is_same_v<A, float>) {
    if (cpu_capability() == CpuCapability::Avx512)
      return batch_norm_planes::map_planes_avx512(out, p, q, pb, pe, g.s, g.c, a, b, d, ahead);
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

#define EMBER_BATCH_NORM_CHANNELS(T, A)                                                                            \
  template void plane_pair_sums<T>(nl::Sums2*, const T*, const T*, int64_t, int64_t, int64_t, int64_t);           \
  template void map_plane_range<T, A>(T*, const T*, const T*, const A*, const A*, const A*, int64_t, int64_t,    \
                                      const ChannelGeometry&, int64_t);
EMBER_BATCH_NORM_CHANNELS(float, float)
EMBER_BATCH_NORM_CHANNELS(double, double)
EMBER_BATCH_NORM_CHANNELS(BFloat16, float)
EMBER_BATCH_NORM_CHANNELS(Half, float)
#undef EMBER_BATCH_NORM_CHANNELS

#define EMBER_BATCH_NORM_CHANNEL_STATS(A)                                                                          \
  template void gather_channel<A>(A*, A*, const RunningStats<A>&, int64_t, double, double, double, double);       \
  template void forward_coefficients<A>(A*, A*, int64_t, const A*, const A*, const A*, const A*);                 \
  template void backward_coefficients<A>(A*, A*, A*, int64_t, const A*, const A*, const A*, const double*,        \
                                         const double*, double);
EMBER_BATCH_NORM_CHANNEL_STATS(float)
EMBER_BATCH_NORM_CHANNEL_STATS(double)
#undef EMBER_BATCH_NORM_CHANNEL_STATS

}  // namespace ember::cpu::batch_norm_channels
