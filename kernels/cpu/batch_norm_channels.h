// Batch norm's plane walk over a contiguous [n, c, s] input whose planes (s >= kPlaneMin
// elements) are runs of one channel: each plane's sums, a channel's totals from them, the
// per-channel statistics and backward coefficients, and the per-channel affine maps over a range
// of planes. The pieces (normalization_batch_norm.cpp) and the one-pass kernels
// (normalization_batch_norm_fused.cpp) both compute through these, so they give the same bits:
// they are compiled once (batch_norm_channels.cpp), not inlined into each caller, where the
// compiler could fuse a multiply and an add in one copy and not in the other.
#pragma once
#include <algorithm>
#include <cstdint>

#include "core/native/normalization.h"
#include "kernels/cpu/normalization_lanes.h"

namespace ember::cpu::batch_norm_channels {

namespace nl = norm_lanes;
using native::ChannelGeometry;

constexpr int64_t kPlaneMin = 32;
constexpr int64_t kTaskElements = 16384;  // elements per parallel task, about

// Planes per chunk of a channel's total: the chunks' sums are added in order.
inline int64_t planes_per_chunk(int64_t s) { return std::max<int64_t>(1, kTaskElements / s); }

// out[p - pb] = {sum v, sum v * w} over plane p, for the planes [pb, pe) of s elements. A plane's
// sums are the same bits alone or beside its neighbour, and on either instruction set.
// ahead != 0: the planes `ahead` elements on are fetched meanwhile (the one-pass kernels' next
// sample), spread between the sums' steps where the loop allows it. T: float, double, BFloat16
// or Half.
template <typename T>
void plane_pair_sums(nl::Sums2* out, const T* v, const T* w, int64_t pb, int64_t pe, int64_t s, int64_t ahead = 0);

// A channel's totals from the sums of its n planes (first[i * stride] for sample i): fixed
// chunks of planes added in order, and the chunks added in order.
nl::Sums2 channel_total(const nl::Sums2* first, int64_t stride, int64_t n, int64_t s);

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
// running statistics' update. A: float or double, as the three below.
template <typename A>
void gather_channel(A* mean, A* invstd, const RunningStats<A>& running, int64_t c, double sum, double sumsq,
                    double count, double eps);

// The forward map of channel c, y = x * scale + shift: scale = invstd w, shift = b - mean scale
// (w and b may be null: ones and zeros).
template <typename A>
void forward_coefficients(A* scale, A* shift, int64_t c, const A* mean, const A* invstd, const A* w, const A* b);

// sum dy (x - mean) from sum dy x and sum dy (the products exact in double).
double centred_product_sum(double sum_dy_x, double mean, double sum_dy);

// The backward map of channel c, dx = dy a + x b + d (see batch_norm_backward_elemt_stub): with
// a = invstd w and k = invstd^2 sum_dy_xmu / count, b = -k a and d = (mean k - sum_dy / count) a.
// sum_dy and sum_dy_xmu null: the fixed-statistics gradient dy a.
template <typename A>
void backward_coefficients(A* ca, A* cb, A* cd, int64_t c, const A* mean, const A* invstd, const A* w,
                           const double* sum_dy, const double* sum_dy_xmu, double count);

// out = p * a[c] + q * b[c] + d[c] over the planes [pb, pe) (plane i has channel i % g.c); q
// null: out = p * a[c] + d[c] (b unused). A plane's values do not depend on the range it is
// mapped in, nor on the instruction set. ahead != 0: on AVX-512, the lines of out `ahead`
// elements on are claimed for writing meanwhile. T as plane_pair_sums', A = acc_t<T>.
template <typename T, typename A>
void map_plane_range(T* out, const T* p, const T* q, const A* a, const A* b, const A* d, int64_t pb, int64_t pe,
                     const ChannelGeometry& g, int64_t ahead = 0);

}  // namespace ember::cpu::batch_norm_channels
