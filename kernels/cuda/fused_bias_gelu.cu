// CUDA bias + GELU, forward and backward (core/native/fused.h), semantics as
// kernels/cpu/fused_bias_gelu.cpp: y = gelu(x + bias) with the erf form or the tanh
// approximation, 16-bit types computed in float, f64 in double.
//
// Forward and the dx-only backward are one grid-stride pass, a thread per element. When the
// bias gradient is wanted, blocks of (32, kTileRows) threads own 32 columns of a chunk of
// kRowsPerChunk rows: they write dx and add the unrounded products of each column into a
// double partial sum per chunk (the kTileRows partials joined in a fixed order); a second
// kernel adds the chunks of each column in chunk order. Chunks have a fixed size, so the bias
// gradient is the same bits on every run and every device, with no atomics.
#include <cstdint>
#include <type_traits>

#include "core/factory.h"
#include "core/native/fused.h"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/device_types.cuh"
#include "kernels/cuda/dtype_io.cuh"
#include "kernels/cuda/strided_indexer.cuh"

namespace ember {
namespace {

constexpr int kThreads = 256;
constexpr int kWarp = 32;
constexpr int kTileRows = 8;           // rows walked side by side within a chunk
constexpr int64_t kRowsPerChunk = 128;  // rows summed into one partial per column
constexpr int64_t kMaxGridY = 65535;

template <bool Tanh, typename A> __device__ __forceinline__ A gelu(A x) {
  if constexpr (Tanh) {
    return A(0.5) * x * (A(1) + d_tanh(A(0.79788456080286535588) * (x + A(0.044715) * x * x * x)));
  } else {
    return A(0.5) * x * d_erfc(-x * A(0.70710678118654752440));
  }
}

template <bool Tanh, typename A> __device__ __forceinline__ A gelu_grad(A x) {
  if constexpr (Tanh) {
    const A x2 = x * x;
    const A t = d_tanh(A(0.79788456080286535588) * x * (A(1) + A(0.044715) * x2));
    return A(0.5) * (A(1) + t) +
           A(0.5) * x * (A(1) - t * t) * A(0.79788456080286535588) * (A(1) + A(3) * A(0.044715) * x2);
  } else {
    return A(0.5) * d_erfc(-x * A(0.70710678118654752440)) +
           x * A(0.39894228040143267794) * d_exp(A(-0.5) * x * x);
  }
}

template <typename T, bool Tanh>
__global__ void bias_gelu_kernel(T* y, const T* x, const cuda::device_acc_t<T>* b, int64_t n, int64_t cols) {
  using C = cuda::Acc<T>;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x)
    y[e] = C::store(gelu<Tanh>(C::load(x[e]) + b[e % cols]));
}

template <typename T, bool Tanh>
__global__ void bias_gelu_dx_kernel(T* dx, const T* g, const T* x, const cuda::device_acc_t<T>* b, int64_t n,
                                    int64_t cols) {
  using C = cuda::Acc<T>;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x)
    dx[e] = C::store(C::load(g[e]) * gelu_grad<Tanh>(C::load(x[e]) + b[e % cols]));
}

// Block (32, kTileRows) at (column tile blockIdx.x, chunks blockIdx.y, + gridDim.y, ...):
// dx of those rows (when dx is not null) and partial[chunk * cols + j], the chunk's column sums.
template <typename T, bool Tanh>
__global__ void bias_gelu_dbias_kernel(T* dx, double* partial, const T* g, const T* x,
                                       const cuda::device_acc_t<T>* b, int64_t rows, int64_t cols, int64_t chunks) {
  using A = cuda::device_acc_t<T>;
  using C = cuda::Acc<T>;
  __shared__ double part[kTileRows][kWarp + 1];
  const int64_t j = int64_t(blockIdx.x) * kWarp + threadIdx.x;
  const A bj = j < cols ? b[j] : A(0);
  for (int64_t chunk = blockIdx.y; chunk < chunks; chunk += gridDim.y) {
    const int64_t r1 = (chunk + 1) * kRowsPerChunk < rows ? (chunk + 1) * kRowsPerChunk : rows;
    double acc = 0.0;
    if (j < cols) {
      for (int64_t r = chunk * kRowsPerChunk + threadIdx.y; r < r1; r += kTileRows) {
        const int64_t e = r * cols + j;
        const A v = C::load(g[e]) * gelu_grad<Tanh>(C::load(x[e]) + bj);
        if (dx) dx[e] = C::store(v);
        acc += double(v);
      }
    }
    __syncthreads();  // the previous chunk's sums have been read
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && j < cols) {
      double s = 0.0;
      for (int k = 0; k < kTileRows; ++k) s += part[k][threadIdx.x];
      partial[chunk * cols + j] = s;
    }
  }
}

// dbias[j] = sum over chunks, in chunk order.
template <typename A>
__global__ void bias_gelu_dbias_finish_kernel(A* dbias, const double* partial, int64_t chunks, int64_t cols) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < cols; j += int64_t(gridDim.x) * blockDim.x) {
    double s = 0.0;
    for (int64_t c = 0; c < chunks; ++c) s += partial[c * cols + j];
    dbias[j] = A(s);
  }
}

// fn(type_tag<T>, bool_constant<tanh>) for the data dtype.
template <typename F>
void dispatch(DType dt, bool tanh_approx, const char* op, F&& fn) {
  cuda::visit_device_type(dt, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (cuda::is_device_float_v<T>) {
      if (tanh_approx) fn(tag, std::true_type{});
      else fn(tag, std::false_type{});
    } else {
      EMBER_FAIL(op, ": expected a floating-point tensor, got ", dtype_name(dt));
    }
  });
}

void bias_gelu_cuda(const Tensor& y, const Tensor& x, const Tensor& bias, bool tanh_approx) {
  cuda::DeviceGuard guard(y.device(), "bias_gelu");
  const int64_t n = x.numel(), cols = x.shape().back();
  if (n == 0 || cols == 0) return;
  const cudaStream_t stream = cuda::current_stream();
  dispatch(x.dtype(), tanh_approx, "bias_gelu", [&](auto tag, auto tanh) {
    using T = typename decltype(tag)::type;
    using A = cuda::device_acc_t<T>;
    bias_gelu_kernel<T, decltype(tanh)::value><<<cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(y.raw_data()), static_cast<const T*>(x.raw_data()), static_cast<const A*>(bias.raw_data()),
        n, cols);
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

void bias_gelu_backward_cuda(const Tensor& dx, const Tensor& dbias, const Tensor& grad, const Tensor& x,
                             const Tensor& bias, bool tanh_approx) {
  if (!dx.defined() && !dbias.defined()) return;
  cuda::DeviceGuard guard(x.device(), "bias_gelu_backward");
  const int64_t cols = x.shape().back();
  if (cols == 0) return;
  const int64_t n = x.numel(), rows = n / cols;
  const cudaStream_t stream = cuda::current_stream();
  dispatch(x.dtype(), tanh_approx, "bias_gelu_backward", [&](auto tag, auto tanh) {
    using T = typename decltype(tag)::type;
    using A = cuda::device_acc_t<T>;
    constexpr bool kTanh = decltype(tanh)::value;
    T* pdx = dx.defined() ? static_cast<T*>(dx.raw_data()) : nullptr;
    const T* pg = static_cast<const T*>(grad.raw_data());
    const T* px = static_cast<const T*>(x.raw_data());
    const A* pb = static_cast<const A*>(bias.raw_data());
    if (!dbias.defined()) {
      bias_gelu_dx_kernel<T, kTanh><<<cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(pdx, pg, px, pb, n, cols);
      EMBER_CUDA_CHECK_LAUNCH();
      return;
    }
    const int64_t chunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
    const Tensor partial = empty({chunks > 0 ? chunks * cols : 1}, {DType::f64, x.device()});
    double* pp = static_cast<double*>(partial.raw_data());
    if (chunks > 0) {
      const dim3 grid(unsigned((cols + kWarp - 1) / kWarp), unsigned(chunks < kMaxGridY ? chunks : kMaxGridY));
      bias_gelu_dbias_kernel<T, kTanh><<<grid, dim3(kWarp, kTileRows), 0, stream>>>(pdx, pp, pg, px, pb, rows, cols,
                                                                                    chunks);
      EMBER_CUDA_CHECK_LAUNCH();
    }
    bias_gelu_dbias_finish_kernel<A><<<cuda::grid_for(cols, kThreads), kThreads, 0, stream>>>(
        static_cast<A*>(dbias.raw_data()), pp, chunks, cols);
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::bias_gelu_stub, CUDA, &bias_gelu_cuda);
EMBER_REGISTER_KERNEL(native::bias_gelu_backward_stub, CUDA, &bias_gelu_backward_cuda);

}  // namespace ember
