// CUDA group norm, forward and backward, on the stubs of core/native/normalization.h, with the
// semantics of kernels/cpu/normalization_group_norm.cpp (statistics summed in double).
//
// Forward: a row team (row_reduce.cuh) per (sample, group) row of c / groups * s contiguous
// elements. Backward: a row team per (sample, channel) plane for sum(dy) and sum(dy x), a
// thread per (sample, group) for the row's coefficients, a grid-stride pass for dx, and a
// thread per channel adding dweight and dbias over the samples in order.
#include <cstdint>

#include "core/factory.h"
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

template <typename T, bool kBlock>
__global__ void group_norm_rows_kernel(T* y, device_acc_t<T>* mean, device_acc_t<T>* rstd, const T* x,
                                       const device_acc_t<T>* w, const device_acc_t<T>* b, int64_t rows,
                                       int64_t groups, int64_t cg, int64_t s, double eps) {
  using A = device_acc_t<T>;
  using C = Acc<T>;
  using Team = RowTeam<kBlock>;
  const int64_t len = cg * s;
  for (int64_t r = Team::first(); r < rows; r += Team::step()) {
    const T* xr = x + r * len;
    double sum = 0, sumsq = 0;
    for (int64_t i = Team::lane(); i < len; i += Team::width()) {
      const double v = double(C::load(xr[i]));
      sum += v;
      sumsq += v * v;
    }
    sum = Team::reduce(sum, Sum{}, 0.0);
    sumsq = Team::reduce(sumsq, Sum{}, 0.0);
    const double m = sum / double(len), d = sumsq / double(len) - m * m;
    const double rs = 1.0 / sqrt((d > 0 ? d : 0.0) + eps);
    if (Team::lane() == 0) {
      mean[r] = A(m);
      rstd[r] = A(rs);
    }
    const int64_t c0 = (r % groups) * cg;
    for (int64_t i = Team::lane(); i < len; i += Team::width()) {
      const int64_t ch = c0 + i / s;
      const A scale = A(rs) * (w ? w[ch] : A(1));
      y[r * len + i] = C::store((C::load(xr[i]) - A(m)) * scale + (b ? b[ch] : A(0)));
    }
  }
}

// sdy[p] = sum dy, sdyx[p] = sum dy x over plane p = (sample, channel).
template <typename T, bool kBlock>
__global__ void plane_sums_kernel(double* sdy, double* sdyx, const T* dy, const T* x, int64_t planes, int64_t s) {
  using C = Acc<T>;
  using Team = RowTeam<kBlock>;
  for (int64_t p = Team::first(); p < planes; p += Team::step()) {
    double a = 0, b = 0;
    for (int64_t i = Team::lane(); i < s; i += Team::width()) {
      const double g = double(C::load(dy[p * s + i]));
      a += g;
      b += g * double(C::load(x[p * s + i]));
    }
    a = Team::reduce(a, Sum{}, 0.0);
    b = Team::reduce(b, Sum{}, 0.0);
    if (Team::lane() == 0) {
      sdy[p] = a;
      sdyx[p] = b;
    }
  }
}

// Per (sample, group) row: dx = dy (rs w) + x cb + cd with cb = -rs^2 m2, cd = rs^2 mean m2 - rs m1.
template <typename A>
__global__ void row_coefficients_kernel(double* cb, double* cd, const double* sdy, const double* sdyx, const A* mean,
                                        const A* rstd, const A* w, int64_t rows, int64_t groups, int64_t cg,
                                        int64_t s) {
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < rows; r += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c0 = (r % groups) * cg;
    const double mu = double(mean[r]), rs = double(rstd[r]), len = double(cg * s);
    double m1 = 0, m2 = 0;
    for (int64_t j = 0; j < cg; ++j) {
      const double wc = w ? double(w[c0 + j]) : 1.0;
      m1 += wc * sdy[r * cg + j];
      m2 += wc * (sdyx[r * cg + j] - mu * sdy[r * cg + j]);
    }
    m1 /= len;
    m2 = m2 * rs / len;
    cb[r] = -rs * rs * m2;
    cd[r] = rs * rs * mu * m2 - rs * m1;
  }
}

template <typename T>
__global__ void dx_kernel(T* dx, const T* dy, const T* x, const device_acc_t<T>* rstd, const device_acc_t<T>* w,
                          const double* cb, const double* cd, int64_t numel, int64_t c, int64_t groups, int64_t s) {
  using A = device_acc_t<T>;
  using C = Acc<T>;
  const int64_t cg = c / groups;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < numel; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t plane = i / s, ch = plane % c, r = (plane / c) * groups + ch / cg;
    const A a = rstd[r] * (w ? w[ch] : A(1));
    dx[i] = C::store(C::load(dy[i]) * a + C::load(x[i]) * A(cb[r]) + A(cd[r]));
  }
}

template <typename A>
__global__ void param_grads_kernel(A* dw, A* db, const double* sdy, const double* sdyx, const A* mean, const A* rstd,
                                   int64_t n, int64_t c, int64_t groups) {
  const int64_t cg = c / groups;
  for (int64_t ch = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; ch < c; ch += int64_t(gridDim.x) * blockDim.x) {
    double aw = 0, ab = 0;
    for (int64_t k = 0; k < n; ++k) {
      const int64_t r = k * groups + ch / cg, p = k * c + ch;
      aw += double(rstd[r]) * (sdyx[p] - double(mean[r]) * sdy[p]);
      ab += sdy[p];
    }
    if (dw) dw[ch] = A(aw);
    if (db) db[ch] = A(ab);
  }
}

void group_norm_cuda(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                     const Tensor& bias, const ChannelGeometry& g, int64_t groups, double eps) {
  DeviceGuard guard(x.device(), "group_norm");
  const cudaStream_t stream = current_stream();
  visit_device_floating(x.dtype(), "group_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = device_acc_t<T>;
    const int64_t rows = g.n * groups, cg = g.c / groups;
    launch_rows(rows, cg * g.s, [&](auto block, unsigned grid, int threads) {
      group_norm_rows_kernel<T, decltype(block)::value><<<grid, threads, 0, stream>>>(
          data_or_null<T>(y), data_or_null<A>(mean), data_or_null<A>(rstd), data_or_null<const T>(x),
          data_or_null<const A>(weight), data_or_null<const A>(bias), rows, groups, cg, g.s, eps);
    });
  });
}

void group_norm_backward_cuda(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy,
                              const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                              const ChannelGeometry& g, int64_t groups) {
  DeviceGuard guard(x.device(), "group_norm_backward");
  const cudaStream_t stream = current_stream();
  visit_device_floating(x.dtype(), "group_norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = device_acc_t<T>;
    const int64_t planes = g.n * g.c, rows = g.n * groups, cg = g.c / groups;
    // sdy, sdyx per plane, then cb, cd per row: one f64 scratch tensor, freed in stream order
    const Tensor scratch = empty({2 * planes + 2 * rows}, {DType::f64, x.device()});
    double* sdy = static_cast<double*>(scratch.raw_data());
    double* sdyx = sdy + planes;
    double* cb = sdyx + planes;
    double* cd = cb + rows;
    launch_rows(planes, g.s, [&](auto block, unsigned grid, int threads) {
      plane_sums_kernel<T, decltype(block)::value><<<grid, threads, 0, stream>>>(
          sdy, sdyx, data_or_null<const T>(dy), data_or_null<const T>(x), planes, g.s);
    });
    if (dx.defined()) {
      row_coefficients_kernel<A><<<grid_for(rows, kThreads), kThreads, 0, stream>>>(
          cb, cd, sdy, sdyx, data_or_null<const A>(mean), data_or_null<const A>(rstd), data_or_null<const A>(weight),
          rows, groups, cg, g.s);
      EMBER_CUDA_CHECK_LAUNCH();
      dx_kernel<T><<<grid_for(x.numel(), kThreads), kThreads, 0, stream>>>(
          data_or_null<T>(dx), data_or_null<const T>(dy), data_or_null<const T>(x), data_or_null<const A>(rstd),
          data_or_null<const A>(weight), cb, cd, x.numel(), g.c, groups, g.s);
      EMBER_CUDA_CHECK_LAUNCH();
    }
    if (dweight.defined() || dbias.defined()) {
      param_grads_kernel<A><<<grid_for(g.c, kThreads), kThreads, 0, stream>>>(
          data_or_null<A>(dweight), data_or_null<A>(dbias), sdy, sdyx, data_or_null<const A>(mean),
          data_or_null<const A>(rstd), g.n, g.c, groups);
      EMBER_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::group_norm_stub, CUDA, &group_norm_cuda);
EMBER_REGISTER_KERNEL(native::group_norm_backward_stub, CUDA, &group_norm_backward_cuda);

}  // namespace ember
