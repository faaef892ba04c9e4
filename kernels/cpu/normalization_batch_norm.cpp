// CPU batch norm pieces (core/native/normalization.h): per-channel sums, the statistics and
// running-statistics update, the per-channel affine map and the backward pair.
//
// A contiguous [n, c, s] input is walked in one of two ways. Planes of s >= kPlaneMin elements
// are runs of one channel: the sums take each plane's sums in memory order, then add them per
// channel in fixed chunks of planes, and the maps take plane by plane. Shorter planes ([N, C]
// inputs, small feature maps) are walked row by row ([c * s] contiguous elements), each chunk
// of rows adding into its own column partials and the maps reading per-element coefficients.
// Chunks have a fixed size and are added in order, so results do not depend on the thread
// count. Sums are accumulated in double. The plane walk's steps are batch_norm_channels.h's,
// which the one-pass training kernels (normalization_batch_norm_fused.cpp) share.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "core/native/normalization.h"
#include "core/parallel.h"
#include "core/type_dispatch.h"
#include "kernels/cpu/batch_norm_channels.h"
#include "kernels/cpu/normalization_lanes.h"
#include "kernels/cpu/scratch.h"

namespace ember {
namespace {

using native::ChannelGeometry;
namespace nl = cpu::norm_lanes;
namespace bnc = cpu::batch_norm_channels;
using bnc::kPlaneMin;
using bnc::kTaskElements;

constexpr int64_t kMaxRowChunks = 64;  // bounds the column partials of the row walk

// out_a[c] = sum of v, out_b[c] = sum of v * w over the n and s of channel c.
template <typename T>
void channel_pair_sums(double* out_a, double* out_b, const T* v, const T* w, const ChannelGeometry& g) {
  if (g.s >= kPlaneMin) {
    // Each plane's sums first, walking planes in memory order (per channel the planes are a
    // whole image apart, too far for the prefetcher); then per channel, fixed chunks of planes
    // added in order and the chunks added in order.
    const int64_t planes = g.n * g.c;
    auto* plane_sums = cpu::thread_scratch<nl::Sums2>(0, size_t(planes));
    parallel_for(0, planes, bnc::planes_per_chunk(g.s), [&](int64_t pb, int64_t pe) {
      bnc::plane_pair_sums(plane_sums + pb, v, w, pb, pe, g.s);
    });
    for (int64_t c = 0; c < g.c; ++c) {
      const nl::Sums2 total = bnc::channel_total(plane_sums + c, g.c, g.n, g.s);
      out_a[c] = total.a;
      out_b[c] = total.b;
    }
    return;
  }
  const int64_t cols = g.c * g.s;
  const int64_t wanted = std::clamp<int64_t>(g.n * cols / kTaskElements, 1, std::min(g.n, kMaxRowChunks));
  const int64_t rows_per_chunk = (g.n + wanted - 1) / wanted;
  const int64_t chunks = (g.n + rows_per_chunk - 1) / rows_per_chunk;
  double* part = cpu::thread_scratch<double>(1, size_t(2 * chunks * cols));
  parallel_for(0, chunks, 1, [&](int64_t kb, int64_t ke) {
    for (int64_t k = kb; k < ke; ++k) {
      double* pa = part + 2 * k * cols;
      double* pb = pa + cols;
      std::fill(pa, pa + 2 * cols, 0.0);
      for (int64_t r = k * rows_per_chunk; r < std::min(g.n, (k + 1) * rows_per_chunk); ++r)
        nl::add_run_pairs(pa, pb, v + r * cols, w + r * cols, cols);
    }
  });
  for (int64_t c = 0; c < g.c; ++c) {
    double a = 0, b = 0;
    for (int64_t k = 0; k < chunks; ++k) {
      const double* pa = part + 2 * k * cols + c * g.s;
      for (int64_t j = 0; j < g.s; ++j) a += pa[j], b += pa[cols + j];
    }
    out_a[c] = a;
    out_b[c] = b;
  }
}

// out = p * a[c] + q * b[c] + d[c] for every element of channel c (q may be null: b unused).
template <typename T, typename A>
void channel_map(T* out, const T* p, const T* q, const A* a, const A* b, const A* d, const ChannelGeometry& g) {
  if (g.s >= kPlaneMin) {
    const int64_t planes = g.n * g.c;
    parallel_for(0, planes, bnc::planes_per_chunk(g.s), [&](int64_t pb, int64_t pe) {
      bnc::map_plane_range(out, p, q, a, b, d, pb, pe, g);
    });
    return;
  }
  // per-element coefficients of one row
  const int64_t cols = g.c * g.s;
  A* coef = cpu::thread_scratch<A>(2, size_t(3 * cols));
  for (int64_t c = 0; c < g.c; ++c)
    for (int64_t j = 0; j < g.s; ++j) {
      coef[c * g.s + j] = a[c];
      coef[cols + c * g.s + j] = q ? b[c] : A(0);
      coef[2 * cols + c * g.s + j] = d[c];
    }
  parallel_for(0, g.n, std::max<int64_t>(1, kTaskElements / cols), [&](int64_t rb, int64_t re) {
    for (int64_t r = rb; r < re; ++r) {
      const int64_t off = r * cols;
      nl::combine_arrays(out + off, p + off, q ? q + off : p + off, cols, coef, coef + cols, coef + 2 * cols);
    }
  });
}

void batch_norm_stats_cpu(const Tensor& sum, const Tensor& sumsq, const Tensor& x, const ChannelGeometry& g) {
  visit_floating(x.dtype(), "batch_norm_stats", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = x.data_ptr<T>();
    channel_pair_sums(sum.data_ptr<double>(), sumsq.data_ptr<double>(), px, px, g);
  });
}

void batch_norm_gather_cpu(const Tensor& mean, const Tensor& invstd, const Tensor& running_mean,
                           const Tensor& running_var, const Tensor& sum, const Tensor& sumsq, const Tensor& count,
                           int64_t channels, double momentum, double eps) {
  visit_floating(mean.dtype(), "batch_norm_gather_stats", [&](auto tag) {
    using A = typename decltype(tag)::type;
    if constexpr (std::is_same_v<A, float> || std::is_same_v<A, double>) {
      const double n = count.data_ptr<double>()[0];
      const double* s = sum.data_ptr<double>();
      const double* ss = sumsq.data_ptr<double>();
      const auto running = bnc::running_stats<A>(running_mean, running_var, momentum);
      for (int64_t c = 0; c < channels; ++c)
        bnc::gather_channel(mean.data_ptr<A>(), invstd.data_ptr<A>(), running, c, s[c], ss[c], n, eps);
    } else {
      EMBER_FAIL("batch_norm_gather_stats: statistics must be f32 or f64, got ", dtype_name(mean.dtype()));
    }
  });
}

void batch_norm_elemt_cpu(const Tensor& y, const Tensor& x, const Tensor& mean, const Tensor& invstd,
                          const Tensor& weight, const Tensor& bias, const ChannelGeometry& g) {
  visit_floating(x.dtype(), "batch_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const A* m = mean.data_ptr<A>();
    const A* is = invstd.data_ptr<A>();
    const A* w = nl::data_or_null<A>(weight);
    const A* b = nl::data_or_null<A>(bias);
    // y = x * scale + shift, scale = invstd * w, shift = b - mean * scale
    std::vector<A> scale(size_t(g.c)), shift(size_t(g.c));
    for (int64_t c = 0; c < g.c; ++c) bnc::forward_coefficients(scale.data(), shift.data(), c, m, is, w, b);
    channel_map<T, A>(y.data_ptr<T>(), x.data_ptr<T>(), nullptr, scale.data(), nullptr, shift.data(), g);
  });
}

void batch_norm_backward_reduce_cpu(const Tensor& sum_dy, const Tensor& sum_dy_xmu, const Tensor& dy,
                                    const Tensor& x, const Tensor& mean, const ChannelGeometry& g) {
  visit_floating(x.dtype(), "batch_norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    double* sdy = sum_dy.data_ptr<double>();
    double* sxmu = sum_dy_xmu.data_ptr<double>();
    channel_pair_sums(sdy, sxmu, dy.data_ptr<T>(), x.data_ptr<T>(), g);
    // sum dy (x - mean) = sum dy x - mean sum dy (products exact in double)
    const A* m = mean.data_ptr<A>();
    for (int64_t c = 0; c < g.c; ++c) sxmu[c] = bnc::centred_product_sum(sxmu[c], double(m[c]), sdy[c]);
  });
}

void batch_norm_backward_elemt_cpu(const Tensor& dx, const Tensor& dy, const Tensor& x, const Tensor& mean,
                                   const Tensor& invstd, const Tensor& weight, const Tensor& sum_dy,
                                   const Tensor& sum_dy_xmu, const Tensor& count, const ChannelGeometry& g) {
  visit_floating(x.dtype(), "batch_norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const A* m = mean.data_ptr<A>();
    const A* is = invstd.data_ptr<A>();
    const A* w = nl::data_or_null<A>(weight);
    const double* sdy = nl::data_or_null<double>(sum_dy);
    const double* sxmu = nl::data_or_null<double>(sum_dy_xmu);
    const double n = count.defined() ? count.data_ptr<double>()[0] : 1.0;
    std::vector<A> ca(size_t(g.c)), cb(size_t(g.c)), cd(size_t(g.c));
    for (int64_t c = 0; c < g.c; ++c)
      bnc::backward_coefficients(ca.data(), cb.data(), cd.data(), c, m, is, w, sdy, sxmu, n);
    channel_map<T, A>(dx.data_ptr<T>(), dy.data_ptr<T>(), x.data_ptr<T>(), ca.data(), cb.data(), cd.data(), g);
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::batch_norm_stats_stub, CPU, &batch_norm_stats_cpu);
EMBER_REGISTER_KERNEL(native::batch_norm_gather_stub, CPU, &batch_norm_gather_cpu);
EMBER_REGISTER_KERNEL(native::batch_norm_elemt_stub, CPU, &batch_norm_elemt_cpu);
EMBER_REGISTER_KERNEL(native::batch_norm_backward_reduce_stub, CPU, &batch_norm_backward_reduce_cpu);
EMBER_REGISTER_KERNEL(native::batch_norm_backward_elemt_stub, CPU, &batch_norm_backward_elemt_cpu);

}  // namespace ember
