// CUDA RMS norm, forward and backward, on the stubs of core/native/normalization.h, with the
// semantics of kernels/cpu/normalization_rms_norm.cpp: a row team (row_reduce.cuh) per row for
// the sum of squares or sum(dy w x), and dweight as column sums over the rows
// (column_sums.cuh: fixed chunks in double, no atomics, the same bits on every run).
#include <cstdint>

#include "core/native/normalization.h"
#include "kernels/cuda/column_sums.cuh"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/device_types.cuh"
#include "kernels/cuda/dtype_io.cuh"
#include "kernels/cuda/row_reduce.cuh"

namespace ember {
namespace {

using namespace cuda;

template <typename T, bool kBlock>
__global__ void rms_norm_rows_kernel(T* y, device_acc_t<T>* rstd, const T* x, const device_acc_t<T>* w, int64_t rows,
                                     int64_t cols, double eps) {
  using A = device_acc_t<T>;
  using C = Acc<T>;
  using Team = RowTeam<kBlock>;
  for (int64_t r = Team::first(); r < rows; r += Team::step()) {
    const T* xr = x + r * cols;
    double ss = 0;
    for (int64_t i = Team::lane(); i < cols; i += Team::width()) {
      const double v = double(C::load(xr[i]));
      ss += v * v;
    }
    ss = Team::reduce(ss, Sum{}, 0.0);
    const A rs = A(1.0 / sqrt(ss / double(cols) + eps));
    if (Team::lane() == 0) rstd[r] = rs;
    for (int64_t i = Team::lane(); i < cols; i += Team::width()) {
      const A v = C::load(xr[i]) * rs;
      y[r * cols + i] = C::store(w ? v * w[i] : v);
    }
  }
}

// dx = dy w rs - x rs^3 sum(dy w x) / cols
template <typename T, bool kBlock>
__global__ void rms_norm_dx_rows_kernel(T* dx, const T* dy, const T* x, const device_acc_t<T>* rstd,
                                        const device_acc_t<T>* w, int64_t rows, int64_t cols) {
  using A = device_acc_t<T>;
  using C = Acc<T>;
  using Team = RowTeam<kBlock>;
  for (int64_t r = Team::first(); r < rows; r += Team::step()) {
    const int64_t base = r * cols;
    double dot = 0;
    for (int64_t i = Team::lane(); i < cols; i += Team::width()) {
      const A g = w ? C::load(dy[base + i]) * w[i] : C::load(dy[base + i]);
      dot += double(g) * double(C::load(x[base + i]));
    }
    dot = Team::reduce(dot, Sum{}, 0.0);
    const double rs = double(rstd[r]);
    const A b = A(-rs * rs * rs * dot / double(cols));
    for (int64_t i = Team::lane(); i < cols; i += Team::width()) {
      const A g = w ? C::load(dy[base + i]) * w[i] : C::load(dy[base + i]);
      dx[base + i] = C::store(g * A(rs) + C::load(x[base + i]) * b);
    }
  }
}

// dweight = sum over rows of dy * x * rstd, per element for column_sums.
template <typename T>
struct RmsNormWeightGradValues {
  using A = device_acc_t<T>;
  const T* dy;
  const T* x;
  const A* rstd;
  int64_t cols;
  __device__ __forceinline__ void operator()(int64_t r, int64_t j, double (&v)[1]) const {
    using C = Acc<T>;
    v[0] = double(C::load(dy[r * cols + j]) * C::load(x[r * cols + j]) * rstd[r]);
  }
};

void rms_norm_cuda(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& weight, int64_t rows,
                   int64_t cols, double eps) {
  DeviceGuard guard(x.device(), "rms_norm");
  const cudaStream_t stream = current_stream();
  visit_device_floating(x.dtype(), "rms_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = device_acc_t<T>;
    launch_rows(rows, cols, [&](auto block, unsigned grid, int threads) {
      rms_norm_rows_kernel<T, decltype(block)::value><<<grid, threads, 0, stream>>>(
          data_or_null<T>(y), data_or_null<A>(rstd), data_or_null<const T>(x), data_or_null<const A>(weight), rows, cols,
          eps);
    });
  });
}

void rms_norm_backward_cuda(const Tensor& dx, const Tensor& dweight, const Tensor& dy, const Tensor& x,
                            const Tensor& rstd, const Tensor& weight, int64_t rows, int64_t cols) {
  DeviceGuard guard(x.device(), "rms_norm_backward");
  const cudaStream_t stream = current_stream();
  visit_device_floating(x.dtype(), "rms_norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = device_acc_t<T>;
    const T* pg = data_or_null<const T>(dy);
    const T* px = data_or_null<const T>(x);
    const A* pr = data_or_null<const A>(rstd);
    if (dx.defined()) {
      launch_rows(rows, cols, [&](auto block, unsigned grid, int threads) {
        rms_norm_dx_rows_kernel<T, decltype(block)::value>
            <<<grid, threads, 0, stream>>>(data_or_null<T>(dx), pg, px, pr, data_or_null<const A>(weight), rows, cols);
      });
    }
    if (dweight.defined()) {
      const RmsNormWeightGradValues<T> values{pg, px, pr, cols};
      column_sums<1, A>({{data_or_null<A>(dweight)}}, rows, cols, values, x.device(), stream);
    }
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::rms_norm_stub, CUDA, &rms_norm_cuda);
EMBER_REGISTER_KERNEL(native::rms_norm_backward_stub, CUDA, &rms_norm_backward_cuda);

}  // namespace ember
