// CUDA softmax, log-softmax and layer norm, forward and backward, on the stubs of
// core/native/normalization.h. Semantics match kernels/cpu/normalization_softmax.cpp and normalization_layer_norm.cpp:
// 16-bit types compute in float, the row max is subtracted before exp, and a NaN anywhere in
// a softmax row makes the whole row NaN.
//
// Rows (softmax with inner == 1, every layer-norm row) go to one warp each when they are short
// and to one block each when they are long; sums and maxima are warp-shuffle reductions
// (joined through shared memory across the warps of a block). Softmax along a non-last dim
// gives each thread one column of the [outer, len, inner] view: neighbouring threads read
// neighbouring elements, so the strided walk down a column stays coalesced. dweight and dbias
// are column sums over the rows (column_sums.cuh): fixed chunks of rows summed in double, then
// the chunks in order, so no atomics are needed and the results do not change from run to run.
#include <cstdint>
#include <limits>
#include <type_traits>

#include "core/native/normalization.h"
#include "kernels/cuda/column_sums.cuh"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/device_types.cuh"
#include "kernels/cuda/dtype_io.cuh"
#include "kernels/cuda/row_reduce.cuh"
#include "kernels/cuda/strided_indexer.cuh"

namespace ember {
namespace {

using native::SoftmaxGeometry;

constexpr int kThreads = 256;  // column kernels

// row teams, reductions and launch_rows (row_reduce.cuh); visit_device_floating (device_types.cuh)
using namespace cuda;

template <typename A> __device__ __forceinline__ A neg_inf() { return -std::numeric_limits<A>::infinity(); }

// ---- softmax over rows (inner == 1)

template <typename T, bool kBlock>
__global__ void softmax_rows_kernel(T* out, const T* x, int64_t rows, int64_t len, bool log) {
  using A = cuda::device_acc_t<T>;
  using C = cuda::Acc<T>;
  using Team = RowTeam<kBlock>;
  for (int64_t r = Team::first(); r < rows; r += Team::step()) {
    const T* xr = x + r * len;
    T* yr = out + r * len;
    A m = neg_inf<A>();
    for (int64_t i = Team::lane(); i < len; i += Team::width()) m = MaxNan{}(m, C::load(xr[i]));
    m = Team::reduce(m, MaxNan{}, neg_inf<A>());
    A s = A(0);
    for (int64_t i = Team::lane(); i < len; i += Team::width()) s += d_exp(C::load(xr[i]) - m);
    s = Team::reduce(s, Sum{}, A(0));
    if (log) {
      const A log_sum = d_log(s);
      for (int64_t i = Team::lane(); i < len; i += Team::width()) yr[i] = C::store((C::load(xr[i]) - m) - log_sum);
    } else {
      const A inv = A(1) / s;
      for (int64_t i = Team::lane(); i < len; i += Team::width()) yr[i] = C::store(d_exp(C::load(xr[i]) - m) * inv);
    }
  }
}

template <typename T, bool kBlock>
__global__ void softmax_backward_rows_kernel(T* gi, const T* go, const T* y, int64_t rows, int64_t len, bool log) {
  using A = cuda::device_acc_t<T>;
  using C = cuda::Acc<T>;
  using Team = RowTeam<kBlock>;
  for (int64_t r = Team::first(); r < rows; r += Team::step()) {
    const int64_t base = r * len;
    A s = A(0);
    for (int64_t i = Team::lane(); i < len; i += Team::width())
      s += log ? C::load(go[base + i]) : C::load(go[base + i]) * C::load(y[base + i]);
    s = Team::reduce(s, Sum{}, A(0));
    for (int64_t i = Team::lane(); i < len; i += Team::width()) {
      const A g = C::load(go[base + i]), yv = C::load(y[base + i]);
      gi[base + i] = C::store(log ? g - d_exp(yv) * s : yv * (g - s));
    }
  }
}

// ---- softmax along a non-last dim: one thread per (outer, inner) column

template <typename T>
__global__ void softmax_cols_kernel(T* out, const T* x, int64_t outer, int64_t len, int64_t inner, bool log) {
  using A = cuda::device_acc_t<T>;
  using C = cuda::Acc<T>;
  const int64_t columns = outer * inner;
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < columns; c += int64_t(gridDim.x) * blockDim.x) {
    const int64_t base = (c / inner) * len * inner + c % inner;
    A m = neg_inf<A>();
    for (int64_t i = 0; i < len; ++i) m = MaxNan{}(m, C::load(x[base + i * inner]));
    A s = A(0);
    for (int64_t i = 0; i < len; ++i) s += d_exp(C::load(x[base + i * inner]) - m);
    if (log) {
      const A log_sum = d_log(s);
      for (int64_t i = 0; i < len; ++i) out[base + i * inner] = C::store((C::load(x[base + i * inner]) - m) - log_sum);
    } else {
      const A inv = A(1) / s;
      for (int64_t i = 0; i < len; ++i) out[base + i * inner] = C::store(d_exp(C::load(x[base + i * inner]) - m) * inv);
    }
  }
}

template <typename T>
__global__ void softmax_backward_cols_kernel(T* gi, const T* go, const T* y, int64_t outer, int64_t len,
                                             int64_t inner, bool log) {
  using A = cuda::device_acc_t<T>;
  using C = cuda::Acc<T>;
  const int64_t columns = outer * inner;
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < columns; c += int64_t(gridDim.x) * blockDim.x) {
    const int64_t base = (c / inner) * len * inner + c % inner;
    A s = A(0);
    for (int64_t i = 0; i < len; ++i) {
      const int64_t k = base + i * inner;
      s += log ? C::load(go[k]) : C::load(go[k]) * C::load(y[k]);
    }
    for (int64_t i = 0; i < len; ++i) {
      const int64_t k = base + i * inner;
      const A g = C::load(go[k]), yv = C::load(y[k]);
      gi[k] = C::store(log ? g - d_exp(yv) * s : yv * (g - s));
    }
  }
}

// ---- layer norm

// Statistics in two passes over the row (mean, then squared deviations): no cancellation.
template <typename T, bool kBlock>
__global__ void layer_norm_rows_kernel(T* y, cuda::device_acc_t<T>* mean_out, cuda::device_acc_t<T>* rstd_out,
                                       const T* x, const cuda::device_acc_t<T>* w, const cuda::device_acc_t<T>* b,
                                       int64_t rows, int64_t cols, cuda::device_acc_t<T> eps) {
  using A = cuda::device_acc_t<T>;
  using C = cuda::Acc<T>;
  using Team = RowTeam<kBlock>;
  const A inv_cols = A(1) / A(cols);
  for (int64_t r = Team::first(); r < rows; r += Team::step()) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    A s = A(0);
    for (int64_t i = Team::lane(); i < cols; i += Team::width()) s += C::load(xr[i]);
    const A mean = Team::reduce(s, Sum{}, A(0)) * inv_cols;
    A ss = A(0);
    for (int64_t i = Team::lane(); i < cols; i += Team::width()) {
      const A d = C::load(xr[i]) - mean;
      ss += d * d;
    }
    const A var = Team::reduce(ss, Sum{}, A(0)) * inv_cols;
    const A rstd = A(1) / d_sqrt(var + eps);
    if (Team::lane() == 0) {
      mean_out[r] = mean;
      rstd_out[r] = rstd;
    }
    for (int64_t i = Team::lane(); i < cols; i += Team::width()) {
      A h = (C::load(xr[i]) - mean) * rstd;
      if (w) h *= w[i];
      if (b) h += b[i];
      yr[i] = C::store(h);
    }
  }
}

// dx = rstd * (g*w - mean(g*w) - xhat * mean(g*w*xhat))
template <typename T, bool kBlock>
__global__ void layer_norm_dx_rows_kernel(T* dx, const T* g, const T* x, const cuda::device_acc_t<T>* mean,
                                          const cuda::device_acc_t<T>* rstd, const cuda::device_acc_t<T>* w,
                                          int64_t rows, int64_t cols) {
  using A = cuda::device_acc_t<T>;
  using C = cuda::Acc<T>;
  using Team = RowTeam<kBlock>;
  const A inv_cols = A(1) / A(cols);
  for (int64_t r = Team::first(); r < rows; r += Team::step()) {
    const int64_t base = r * cols;
    const A m = mean[r], rs = rstd[r];
    A sum_gw = A(0), sum_gw_xhat = A(0);
    for (int64_t i = Team::lane(); i < cols; i += Team::width()) {
      const A gw = w ? C::load(g[base + i]) * w[i] : C::load(g[base + i]);
      sum_gw += gw;
      sum_gw_xhat += gw * ((C::load(x[base + i]) - m) * rs);
    }
    const A a = Team::reduce(sum_gw, Sum{}, A(0)) * inv_cols;
    const A c = Team::reduce(sum_gw_xhat, Sum{}, A(0)) * inv_cols;
    for (int64_t i = Team::lane(); i < cols; i += Team::width()) {
      const A gw = w ? C::load(g[base + i]) * w[i] : C::load(g[base + i]);
      const A xhat = (C::load(x[base + i]) - m) * rs;
      dx[base + i] = C::store(rs * (gw - a - xhat * c));
    }
  }
}

// dweight = sum_rows g*xhat and dbias = sum_rows g, per element for column_sums: value 0 is
// g*xhat (zero when dweight is not wanted), value 1 is g.
template <typename T>
struct LayerNormParamGradValues {
  using A = cuda::device_acc_t<T>;
  const T* g;
  const T* x;
  const A* mean;
  const A* rstd;
  bool want_dw;
  int64_t cols;
  __device__ __forceinline__ void operator()(int64_t r, int64_t j, double (&v)[2]) const {
    using C = cuda::Acc<T>;
    const A gv = C::load(g[r * cols + j]);
    v[0] = want_dw ? double(gv * ((C::load(x[r * cols + j]) - mean[r]) * rstd[r])) : 0.0;
    v[1] = double(gv);
  }
};

// ---- host side

void softmax_cuda(const Tensor& out, const Tensor& x, const SoftmaxGeometry& g, bool log) {
  const char* name = log ? "log_softmax" : "softmax";
  cuda::DeviceGuard guard(out.device(), name);
  if (g.outer == 0 || g.len == 0 || g.inner == 0) return;
  const cudaStream_t stream = cuda::current_stream();
  cuda::visit_device_floating(x.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* po = static_cast<T*>(out.raw_data());
    const T* px = static_cast<const T*>(x.raw_data());
    if (g.inner == 1) {
      launch_rows(g.outer, g.len, [&](auto block, unsigned grid, int threads) {
        softmax_rows_kernel<T, decltype(block)::value><<<grid, threads, 0, stream>>>(po, px, g.outer, g.len, log);
      });
    } else {
      softmax_cols_kernel<T><<<cuda::grid_for(g.outer * g.inner, kThreads), kThreads, 0, stream>>>(
          po, px, g.outer, g.len, g.inner, log);
      EMBER_CUDA_CHECK_LAUNCH();
    }
  });
}

void softmax_backward_cuda(const Tensor& grad_in, const Tensor& grad_out, const Tensor& y, const SoftmaxGeometry& g,
                           bool log) {
  const char* name = log ? "log_softmax_backward" : "softmax_backward";
  cuda::DeviceGuard guard(grad_in.device(), name);
  if (g.outer == 0 || g.len == 0 || g.inner == 0) return;
  const cudaStream_t stream = cuda::current_stream();
  cuda::visit_device_floating(y.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* pi = static_cast<T*>(grad_in.raw_data());
    const T* pg = static_cast<const T*>(grad_out.raw_data());
    const T* py = static_cast<const T*>(y.raw_data());
    if (g.inner == 1) {
      launch_rows(g.outer, g.len, [&](auto block, unsigned grid, int threads) {
        softmax_backward_rows_kernel<T, decltype(block)::value>
            <<<grid, threads, 0, stream>>>(pi, pg, py, g.outer, g.len, log);
      });
    } else {
      softmax_backward_cols_kernel<T><<<cuda::grid_for(g.outer * g.inner, kThreads), kThreads, 0, stream>>>(
          pi, pg, py, g.outer, g.len, g.inner, log);
      EMBER_CUDA_CHECK_LAUNCH();
    }
  });
}

void layer_norm_cuda(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                     const Tensor& bias, int64_t rows, int64_t cols, double eps) {
  cuda::DeviceGuard guard(y.device(), "layer_norm");
  if (rows == 0 || cols == 0) return;
  const cudaStream_t stream = cuda::current_stream();
  cuda::visit_device_floating(x.dtype(), "layer_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = cuda::device_acc_t<T>;
    T* py = static_cast<T*>(y.raw_data());
    A* pm = static_cast<A*>(mean.raw_data());
    A* pr = static_cast<A*>(rstd.raw_data());
    const T* px = static_cast<const T*>(x.raw_data());
    const A* pw = data_or_null<const A>(weight);
    const A* pb = data_or_null<const A>(bias);
    launch_rows(rows, cols, [&](auto block, unsigned grid, int threads) {
      layer_norm_rows_kernel<T, decltype(block)::value>
          <<<grid, threads, 0, stream>>>(py, pm, pr, px, pw, pb, rows, cols, A(eps));
    });
  });
}

void layer_norm_backward_cuda(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& grad,
                              const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                              int64_t rows, int64_t cols) {
  const Tensor& any = dx.defined() ? dx : (dweight.defined() ? dweight : dbias);
  if (!any.defined()) return;
  cuda::DeviceGuard guard(any.device(), "layer_norm_backward");
  if (cols == 0) return;
  const cudaStream_t stream = cuda::current_stream();
  cuda::visit_device_floating(x.dtype(), "layer_norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = cuda::device_acc_t<T>;
    const T* pg = static_cast<const T*>(grad.raw_data());
    const T* px = static_cast<const T*>(x.raw_data());
    const A* pm = data_or_null<const A>(mean);
    const A* pr = data_or_null<const A>(rstd);
    if (dx.defined() && rows > 0) {
      T* pdx = static_cast<T*>(dx.raw_data());
      const A* pw = data_or_null<const A>(weight);
      launch_rows(rows, cols, [&](auto block, unsigned grid, int threads) {
        layer_norm_dx_rows_kernel<T, decltype(block)::value>
            <<<grid, threads, 0, stream>>>(pdx, pg, px, pm, pr, pw, rows, cols);
      });
    }
    if (dweight.defined() || dbias.defined()) {
      const LayerNormParamGradValues<T> values{pg, px, pm, pr, dweight.defined(), cols};
      column_sums<2, A>({{data_or_null<A>(dweight), data_or_null<A>(dbias)}}, rows, cols, values,
                        any.device(), stream);
    }
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::softmax_stub, CUDA, &softmax_cuda);
EMBER_REGISTER_KERNEL(native::softmax_backward_stub, CUDA, &softmax_backward_cuda);
EMBER_REGISTER_KERNEL(native::layer_norm_stub, CUDA, &layer_norm_cuda);
EMBER_REGISTER_KERNEL(native::layer_norm_backward_stub, CUDA, &layer_norm_backward_cuda);

}  // namespace ember
