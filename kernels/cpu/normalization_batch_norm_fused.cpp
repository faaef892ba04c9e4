// CPU batch norm in training, one kernel per direction (core/native/normalization.h,
// batch_norm_fused_*_stub): the pieces' values (normalization_batch_norm.cpp), bit for bit,
// computed by the same compiled steps (batch_norm_channels.h), with each array read from memory
// once where the pieces read x twice forward and dy and x twice backward.
//
// A thread takes a group of channels at a time, all n samples of them: their planes' sums, the
// channels' statistics (or backward coefficients), then the map over the same planes, which the
// sums have brought into this core's L2 (a group holds about kGroupBytes of what the map reads
// again: x forward, dy and x backward). A group's sums run sample by sample beside the previous
// group's map, and each sample's step fetches the next sample's run (an image away, out of the
// hardware prefetchers' reach): the sums' loads, the map's stores and both loops' arithmetic
// overlap, where one group after the other left each phase to wait on its own.
//
// Only the plane walk (planes of s >= kPlaneMin elements) is taken, and only while a channel
// fits the budget; other inputs go through the pieces. Results do not depend on how the channels
// are grouped or split between threads: a plane's sums and map are the same bits in any range,
// and a channel's total adds its planes in a fixed order.
//
// Measured on the Intel Xeon host (family 6 model 207, AVX-512), kernels alone on
// [128, 64, 14, 14] f32, one thread, medians of interleaved runs: forward 545 us against 737 for
// the pieces' stats and map, backward 875 us against 1120 for their reduce and map (AVX-512
// plane loops in both; AVX2 alone: 680 and 1050 against 800 and 1210). A group of 256 KiB beat
// 128 KiB by a little and 512 KiB or 1 MiB by 15-40% (the map's second look then misses L2);
// fetching the next sample a line at a time between the AVX-512 loops' steps beat fetching it
// all before them by 10%, and claiming the map's next output lines for writing by 5% more.
#include <algorithm>
#include <cstdint>
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

constexpr int64_t kGroupBytes = int64_t(1) << 18;

// Channels per group when the map reads `arrays` arrays of T again; 0 when one channel alone
// is over four times the budget (the pieces serve then).
template <typename T>
int64_t channels_per_group(const ChannelGeometry& g, int arrays) {
  const int64_t channel_bytes = g.n * g.s * int64_t(sizeof(T)) * arrays;
  if (g.s < bnc::kPlaneMin || channel_bytes > 4 * kGroupBytes) return 0;
  return std::max<int64_t>(1, kGroupBytes / channel_bytes);
}

// The distance in elements to sample i's next sample, or 0 when i is the last.
inline int64_t next_sample(int64_t i, const ChannelGeometry& g) { return i + 1 < g.n ? g.c * g.s : 0; }

// Runs the groups of at most `most` channels: the channels split evenly between the threads
// first, each thread's share cut into groups of even size. A group's plane sums
// (sums(plane_sums, c0, c1, sample)) go sample by sample beside the map of the group before it
// (map(c0, c1, sample)), whose data its own sums brought into this core's cache: the sums are
// bound by their arithmetic, the map by the traffic of its stores, and side by side each runs
// in the other's shadow. finish(plane_sums, c0, c1) turns a group's sums into its coefficients.
// plane_sums is the thread's own buffer of samples * most.
template <typename Sums, typename Finish, typename Map>
void run_channel_groups(int64_t channels, int64_t most, int64_t samples, const Sums& sums, const Finish& finish,
                        const Map& map) {
  parallel_for(0, channels, 1, [&](int64_t cb, int64_t ce) {
    nl::Sums2* plane_sums = cpu::thread_scratch<nl::Sums2>(3, size_t(samples * most));
    const int64_t groups = (ce - cb + most - 1) / most;
    const auto bound = [&](int64_t k) { return cb + (ce - cb) * k / groups; };
    for (int64_t k = 0; k <= groups; ++k) {
      for (int64_t i = 0; i < samples; ++i) {
        if (k < groups) sums(plane_sums, bound(k), bound(k + 1), i);
        if (k > 0) map(bound(k - 1), bound(k), i);
      }
      if (k < groups) finish(plane_sums, bound(k), bound(k + 1));
    }
  });
}

// The plane sums of v and v * w over channels [c0, c1) of sample i, into plane_sums[i * (c1 - c0)
// + channel - c0], fetching the next sample's run meanwhile (runs are an image apart, too far
// for the hardware's prefetchers to follow).
template <typename T>
void run_pair_sums(nl::Sums2* plane_sums, const T* v, const T* w, int64_t c0, int64_t c1, int64_t i,
                   const ChannelGeometry& g) {
  bnc::plane_pair_sums(plane_sums + i * (c1 - c0), v, w, i * g.c + c0, i * g.c + c1, g.s, next_sample(i, g));
}

bool batch_norm_fused_forward_cpu(const Tensor& y, const Tensor& mean, const Tensor& invstd,
                                  const Tensor& running_mean, const Tensor& running_var, const Tensor& x,
                                  const Tensor& weight, const Tensor& bias, const ChannelGeometry& g, double momentum,
                                  double eps) {
  bool taken = false;
  visit_floating(x.dtype(), "batch_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const int64_t most = channels_per_group<T>(g, 1);
    if (most == 0) return;
    taken = true;
    const T* px = x.data_ptr<T>();
    T* py = y.data_ptr<T>();
    A* m = mean.data_ptr<A>();
    A* is = invstd.data_ptr<A>();
    const A* w = nl::data_or_null<A>(weight);
    const A* b = nl::data_or_null<A>(bias);
    const auto running = bnc::running_stats<A>(running_mean, running_var, momentum);
    const double count = double(g.n * g.s);
    std::vector<A> scale(size_t(g.c)), shift(size_t(g.c));
    run_channel_groups(
        g.c, most, g.n,
        [&](nl::Sums2* plane_sums, int64_t c0, int64_t c1, int64_t i) {
          run_pair_sums(plane_sums, px, px, c0, c1, i, g);
        },
        [&](const nl::Sums2* plane_sums, int64_t c0, int64_t c1) {
          for (int64_t c = c0; c < c1; ++c) {
            const nl::Sums2 t = bnc::channel_total(plane_sums + (c - c0), c1 - c0, g.n, g.s);
            bnc::gather_channel(m, is, running, c, t.a, t.b, count, eps);
            bnc::forward_coefficients(scale.data(), shift.data(), c, m, is, w, b);
          }
        },
        [&](int64_t c0, int64_t c1, int64_t i) {
          bnc::map_plane_range<T, A>(py, px, nullptr, scale.data(), nullptr, shift.data(), i * g.c + c0,
                                     i * g.c + c1, g, next_sample(i, g));
        });
  });
  return taken;
}

bool batch_norm_fused_backward_cpu(const Tensor& dx, const Tensor& sum_dy, const Tensor& sum_dy_xmu,
                                   const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& invstd,
                                   const Tensor& weight, const ChannelGeometry& g) {
  bool taken = false;
  visit_floating(x.dtype(), "batch_norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const int64_t most = channels_per_group<T>(g, 2);
    if (most == 0) return;
    taken = true;
    const T* px = x.data_ptr<T>();
    const T* pdy = dy.data_ptr<T>();
    T* pdx = dx.data_ptr<T>();
    const A* m = mean.data_ptr<A>();
    const A* is = invstd.data_ptr<A>();
    const A* w = nl::data_or_null<A>(weight);
    double* sdy = sum_dy.data_ptr<double>();
    double* sxmu = sum_dy_xmu.data_ptr<double>();
    const double count = double(g.n * g.s);
    std::vector<A> ca(size_t(g.c)), cb(size_t(g.c)), cd(size_t(g.c));
    run_channel_groups(
        g.c, most, g.n,
        [&](nl::Sums2* plane_sums, int64_t c0, int64_t c1, int64_t i) {
          run_pair_sums(plane_sums, pdy, px, c0, c1, i, g);
        },
        [&](const nl::Sums2* plane_sums, int64_t c0, int64_t c1) {
          for (int64_t c = c0; c < c1; ++c) {
            const nl::Sums2 t = bnc::channel_total(plane_sums + (c - c0), c1 - c0, g.n, g.s);
            sdy[c] = t.a;
            sxmu[c] = bnc::centred_product_sum(t.b, double(m[c]), t.a);
            bnc::backward_coefficients(ca.data(), cb.data(), cd.data(), c, m, is, w, sdy, sxmu, count);
          }
        },
        [&](int64_t c0, int64_t c1, int64_t i) {
          bnc::map_plane_range<T, A>(pdx, pdy, px, ca.data(), cb.data(), cd.data(), i * g.c + c0, i * g.c + c1, g,
                                     next_sample(i, g));
        });
  });
  return taken;
}

}  // namespace

EMBER_REGISTER_KERNEL(native::batch_norm_fused_forward_stub, CPU, &batch_norm_fused_forward_cpu);
EMBER_REGISTER_KERNEL(native::batch_norm_fused_backward_stub, CPU, &batch_norm_fused_backward_cpu);

}  // namespace ember
