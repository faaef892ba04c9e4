// CUDA batch norm pieces on the stubs of core/native/normalization.h, with the semantics of
// kernels/cpu/normalization_batch_norm.cpp: per-channel sums in double, the statistics and the
// running-statistics update, the per-channel affine map and the backward pair.
//
// A channel's elements of the contiguous [n, c, s] input are one "row" of the row teams of
// row_reduce.cuh (a block per channel, walking its n planes of s elements); the maps are
// grid-stride loops over all elements that read their channel's coefficients.
#include <cstdint>

#include "core/native/normalization.h"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/device_types.cuh"
#include "kernels/cuda/dtype_io.cuh"
#include "kernels/cuda/row_reduce.cuh"
#include "kernels/cuda/strided_indexer.cuh"

namespace ember {
namespace {

using namespace cuda;
using native::ChannelGeometry;

constexpr int kThreads = 256;

// out_a[c] = sum v, out_b[c] = sum v * (w - shift[c]) over channel c (shift may be null).
template <typename T>
__global__ void channel_pair_sums_kernel(double* out_a, double* out_b, const T* v, const T* w,
                                         const device_acc_t<T>* shift, int64_t n, int64_t c, int64_t s) {
  using C = Acc<T>;
  using Team = RowTeam<true>;
  const int64_t per_channel = n * s;
  for (int64_t ch = Team::first(); ch < c; ch += Team::step()) {
    const double sh = shift ? double(shift[ch]) : 0.0;
    double a = 0, b = 0;
    for (int64_t i = Team::lane(); i < per_channel; i += Team::width()) {
      const int64_t k = ((i / s) * c + ch) * s + i % s;
      const double vv = double(C::load(v[k]));
      a += vv;
      b += vv * (double(C::load(w[k])) - sh);
    }
    a = Team::reduce(a, Sum{}, 0.0);
    b = Team::reduce(b, Sum{}, 0.0);
    if (Team::lane() == 0) {
      out_a[ch] = a;
      out_b[ch] = b;
    }
  }
}

template <typename A>
__global__ void gather_kernel(A* mean, A* invstd, A* running_mean, A* running_var, const double* sum,
                              const double* sumsq, const double* count, int64_t channels, double momentum,
                              double eps) {
  const double n = count[0];
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < channels; c += int64_t(gridDim.x) * blockDim.x) {
    const double m = sum[c] / n;
    const double d = sumsq[c] / n - m * m;
    const double var = d > 0 ? d : 0.0;
    mean[c] = A(m);
    invstd[c] = A(1.0 / sqrt(var + eps));
    if (running_mean) running_mean[c] = A((1 - momentum) * double(running_mean[c]) + momentum * m);
    if (running_var) running_var[c] = A((1 - momentum) * double(running_var[c]) + momentum * var * n / (n - 1));
  }
}

// y = x * scale + shift with scale = invstd w, shift = b - mean scale.
template <typename T>
__global__ void elemt_kernel(T* y, const T* x, const device_acc_t<T>* mean, const device_acc_t<T>* invstd,
                             const device_acc_t<T>* w, const device_acc_t<T>* b, int64_t numel, int64_t c,
                             int64_t s) {
  using A = device_acc_t<T>;
  using C = Acc<T>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < numel; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ch = (i / s) % c;
    const A scale = invstd[ch] * (w ? w[ch] : A(1));
    const A shift = (b ? b[ch] : A(0)) - mean[ch] * scale;
    y[i] = C::store(C::load(x[i]) * scale + shift);
  }
}

// dx = (dy - sum_dy / n - (x - mean) invstd^2 sum_dy_xmu / n) invstd w; without sums dy invstd w.
template <typename T>
__global__ void backward_elemt_kernel(T* dx, const T* dy, const T* x, const device_acc_t<T>* mean,
                                      const device_acc_t<T>* invstd, const device_acc_t<T>* w, const double* sum_dy,
                                      const double* sum_dy_xmu, const double* count, int64_t numel, int64_t c,
                                      int64_t s) {
  using A = device_acc_t<T>;
  using C = Acc<T>;
  const double n = count ? count[0] : 1.0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < numel; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ch = (i / s) % c;
    const A a = invstd[ch] * (w ? w[ch] : A(1));
    A g = C::load(dy[i]);
    if (sum_dy) {
      const A k = invstd[ch] * invstd[ch] * A(sum_dy_xmu[ch] / n);
      g = g - A(sum_dy[ch] / n) - (C::load(x[i]) - mean[ch]) * k;
    }
    dx[i] = C::store(g * a);
  }
}

void batch_norm_stats_cuda(const Tensor& sum, const Tensor& sumsq, const Tensor& x, const ChannelGeometry& g) {
  DeviceGuard guard(x.device(), "batch_norm_stats");
  const cudaStream_t stream = current_stream();
  visit_device_floating(x.dtype(), "batch_norm_stats", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = static_cast<const T*>(x.raw_data());
    channel_pair_sums_kernel<T><<<grid_for(g.c * kBlockRowThreads, kBlockRowThreads), kBlockRowThreads, 0, stream>>>(
        data_or_null<double>(sum), data_or_null<double>(sumsq), px, px, nullptr, g.n, g.c, g.s);
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

void batch_norm_gather_cuda(const Tensor& mean, const Tensor& invstd, const Tensor& running_mean,
                            const Tensor& running_var, const Tensor& sum, const Tensor& sumsq, const Tensor& count,
                            int64_t channels, double momentum, double eps) {
  DeviceGuard guard(mean.device(), "batch_norm_gather_stats");
  const cudaStream_t stream = current_stream();
  const auto launch = [&](auto* tag) {
    using A = std::remove_pointer_t<decltype(tag)>;
    gather_kernel<A><<<grid_for(channels, kThreads), kThreads, 0, stream>>>(
        data_or_null<A>(mean), data_or_null<A>(invstd), data_or_null<A>(running_mean), data_or_null<A>(running_var),
        data_or_null<const double>(sum), data_or_null<const double>(sumsq), data_or_null<const double>(count), channels,
        momentum, eps);
    EMBER_CUDA_CHECK_LAUNCH();
  };
  if (mean.dtype() == DType::f64) launch(static_cast<double*>(nullptr));
  else launch(static_cast<float*>(nullptr));
}

void batch_norm_elemt_cuda(const Tensor& y, const Tensor& x, const Tensor& mean, const Tensor& invstd,
                           const Tensor& weight, const Tensor& bias, const ChannelGeometry& g) {
  DeviceGuard guard(x.device(), "batch_norm");
  const cudaStream_t stream = current_stream();
  visit_device_floating(x.dtype(), "batch_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = device_acc_t<T>;
    elemt_kernel<T><<<grid_for(x.numel(), kThreads), kThreads, 0, stream>>>(
        data_or_null<T>(y), data_or_null<const T>(x), data_or_null<const A>(mean), data_or_null<const A>(invstd),
        data_or_null<const A>(weight), data_or_null<const A>(bias), x.numel(), g.c, g.s);
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

void batch_norm_backward_reduce_cuda(const Tensor& sum_dy, const Tensor& sum_dy_xmu, const Tensor& dy,
                                     const Tensor& x, const Tensor& mean, const ChannelGeometry& g) {
  DeviceGuard guard(x.device(), "batch_norm_backward");
  const cudaStream_t stream = current_stream();
  visit_device_floating(x.dtype(), "batch_norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = device_acc_t<T>;
    channel_pair_sums_kernel<T><<<grid_for(g.c * kBlockRowThreads, kBlockRowThreads), kBlockRowThreads, 0, stream>>>(
        data_or_null<double>(sum_dy), data_or_null<double>(sum_dy_xmu), data_or_null<const T>(dy),
        data_or_null<const T>(x), data_or_null<const A>(mean), g.n, g.c, g.s);
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

void batch_norm_backward_elemt_cuda(const Tensor& dx, const Tensor& dy, const Tensor& x, const Tensor& mean,
                                    const Tensor& invstd, const Tensor& weight, const Tensor& sum_dy,
                                    const Tensor& sum_dy_xmu, const Tensor& count, const ChannelGeometry& g) {
  DeviceGuard guard(x.device(), "batch_norm_backward");
  const cudaStream_t stream = current_stream();
  visit_device_floating(x.dtype(), "batch_norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = device_acc_t<T>;
    backward_elemt_kernel<T><<<grid_for(x.numel(), kThreads), kThreads, 0, stream>>>(
        data_or_null<T>(dx), data_or_null<const T>(dy), data_or_null<const T>(x), data_or_null<const A>(mean),
        data_or_null<const A>(invstd), data_or_null<const A>(weight), data_or_null<const double>(sum_dy),
        data_or_null<const double>(sum_dy_xmu), data_or_null<const double>(count), x.numel(), g.c, g.s);
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::batch_norm_stats_stub, CUDA, &batch_norm_stats_cuda);
EMBER_REGISTER_KERNEL(native::batch_norm_gather_stub, CUDA, &batch_norm_gather_cuda);
EMBER_REGISTER_KERNEL(native::batch_norm_elemt_stub, CUDA, &batch_norm_elemt_cuda);
EMBER_REGISTER_KERNEL(native::batch_norm_backward_reduce_stub, CUDA, &batch_norm_backward_reduce_cuda);
EMBER_REGISTER_KERNEL(native::batch_norm_backward_elemt_stub, CUDA, &batch_norm_backward_elemt_cuda);

}  // namespace ember
