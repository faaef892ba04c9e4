// CUDA 2-D max and average pooling and their backward, semantics as kernels/cpu/pooling.cpp.
//
// The forward runs one thread per output element over its window. The backward runs one thread
// per input element, which gathers from the outputs whose windows can reach it (the inverse
// ranges of kernels/shared/pooling_window.h): overlapping windows need no atomics, and every
// sum runs in a fixed order, so results never vary between runs. Half types compute in float.
#include <cstdint>
#include <limits>

#include "core/native/pooling.h"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/cuda/device_types.cuh"
#include "kernels/cuda/strided_indexer.cuh"
#include "kernels/shared/pooling_window.h"

namespace ember {
namespace {

constexpr int kThreads = 256;

using kernels::PoolDim;
using native::Pool2dGeometry;

// A grid-stride loop over the cells of [planes, rows, cols]: fn(flat index, plane, row, col).
template <typename F>
__device__ __forceinline__ void for_each_cell(int64_t planes, int64_t rows, int64_t cols, const F& fn) {
  const int64_t total = planes * rows * cols;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x)
    fn(t, t / (rows * cols), (t / cols) % rows, t % cols);
}

template <typename T>
__global__ void max_pool_kernel(T* out, int64_t* indices, const T* x, Pool2dGeometry g, PoolDim dh, PoolDim dw) {
  using A = cuda::device_acc_t<T>;
  using C = cuda::Acc<T>;
  for_each_cell(g.planes, g.out_h, g.out_w, [&](int64_t t, int64_t p, int64_t oh, int64_t ow) {
    const T* in = x + p * g.in_h * g.in_w;
    A best = -std::numeric_limits<A>::infinity();
    int64_t arg = kernels::max_window_first(dh, oh) * g.in_w + kernels::max_window_first(dw, ow);
    for (int64_t kh = 0; kh < g.kernel_h; ++kh) {
      const int64_t ih = oh * g.stride_h - g.pad_h + kh * g.dilation_h;
      if (ih < 0 || ih >= g.in_h) continue;
      for (int64_t kw = 0; kw < g.kernel_w; ++kw) {
        const int64_t iw = ow * g.stride_w - g.pad_w + kw * g.dilation_w;
        if (iw < 0 || iw >= g.in_w) continue;
        const A v = C::load(in[ih * g.in_w + iw]);
        if (v > best || v != v) {  // PyTorch's rule: a strictly greater value or any NaN
          best = v;
          arg = ih * g.in_w + iw;
        }
      }
    }
    out[t] = C::store(best);
    indices[t] = arg;
  });
}

template <typename T>
__global__ void max_pool_backward_kernel(T* grad_in, const T* grad_out, const int64_t* indices, Pool2dGeometry g,
                                         PoolDim dh, PoolDim dw) {
  using A = cuda::device_acc_t<T>;
  using C = cuda::Acc<T>;
  for_each_cell(g.planes, g.in_h, g.in_w, [&](int64_t t, int64_t p, int64_t ih, int64_t iw) {
    const int64_t here = ih * g.in_w + iw, base = p * g.out_h * g.out_w;
    const kernels::OutRange rh = kernels::max_outputs_of(dh, ih), rw = kernels::max_outputs_of(dw, iw);
    A sum = A(0);
    for (int64_t oh = rh.begin; oh < rh.end; ++oh)
      for (int64_t ow = rw.begin; ow < rw.end; ++ow) {
        const int64_t o = base + oh * g.out_w + ow;
        if (indices[o] == here) sum += C::load(grad_out[o]);
      }
    grad_in[t] = C::store(sum);
  });
}

template <typename T>
__global__ void avg_pool_kernel(T* out, const T* x, Pool2dGeometry g, PoolDim dh, PoolDim dw) {
  using A = cuda::device_acc_t<T>;
  using C = cuda::Acc<T>;
  for_each_cell(g.planes, g.out_h, g.out_w, [&](int64_t t, int64_t p, int64_t oh, int64_t ow) {
    const T* in = x + p * g.in_h * g.in_w;
    const kernels::AvgWindow wh = kernels::avg_window(dh, oh, g.adaptive, g.count_include_pad);
    const kernels::AvgWindow ww = kernels::avg_window(dw, ow, g.adaptive, g.count_include_pad);
    A sum = A(0);
    for (int64_t ih = wh.begin; ih < wh.end; ++ih)
      for (int64_t iw = ww.begin; iw < ww.end; ++iw) sum += C::load(in[ih * g.in_w + iw]);
    out[t] = C::store(sum / A(wh.count * ww.count));
  });
}

template <typename T>
__global__ void avg_pool_backward_kernel(T* grad_in, const T* grad_out, Pool2dGeometry g, PoolDim dh, PoolDim dw) {
  using A = cuda::device_acc_t<T>;
  using C = cuda::Acc<T>;
  for_each_cell(g.planes, g.in_h, g.in_w, [&](int64_t t, int64_t p, int64_t ih, int64_t iw) {
    const T* go = grad_out + p * g.out_h * g.out_w;
    const kernels::OutRange rh = kernels::avg_outputs_of(dh, ih, g.adaptive);
    const kernels::OutRange rw = kernels::avg_outputs_of(dw, iw, g.adaptive);
    A sum = A(0);
    for (int64_t oh = rh.begin; oh < rh.end; ++oh) {
      const int64_t count_h = kernels::avg_window(dh, oh, g.adaptive, g.count_include_pad).count;
      for (int64_t ow = rw.begin; ow < rw.end; ++ow) {
        const int64_t count_w = kernels::avg_window(dw, ow, g.adaptive, g.count_include_pad).count;
        sum += C::load(go[oh * g.out_w + ow]) / A(count_h * count_w);
      }
    }
    grad_in[t] = C::store(sum);
  });
}

// On out's device, for the float dtype dt: launch(type tag, blocks) queues a kernel of
// kThreads-thread blocks over `total` items; its launch error is raised.
template <typename F>
void launch_pool(const Tensor& out, DType dt, const char* op, const F& launch) {
  cuda::DeviceGuard guard(out.device(), op);
  cuda::visit_device_floating(dt, op, [&](auto tag) {
    launch(tag, cuda::grid_for(out.numel(), kThreads));
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

template <typename T> T* ptr(const Tensor& t) { return static_cast<T*>(t.raw_data()); }

void max_pool2d_cuda(const Tensor& out, const Tensor& indices, const Tensor& x, const Pool2dGeometry& g) {
  launch_pool(out, x.dtype(), "max_pool2d", [&](auto tag, unsigned blocks) {
    using T = typename decltype(tag)::type;
    max_pool_kernel<T><<<blocks, kThreads, 0, cuda::current_stream()>>>(
        ptr<T>(out), ptr<int64_t>(indices), ptr<const T>(x), g, kernels::pool_dim_h(g), kernels::pool_dim_w(g));
  });
}

void max_pool2d_backward_cuda(const Tensor& grad_in, const Tensor& grad_out, const Tensor& indices,
                              const Pool2dGeometry& g) {
  launch_pool(grad_in, grad_in.dtype(), "max_pool2d_backward", [&](auto tag, unsigned blocks) {
    using T = typename decltype(tag)::type;
    max_pool_backward_kernel<T><<<blocks, kThreads, 0, cuda::current_stream()>>>(
        ptr<T>(grad_in), ptr<const T>(grad_out), ptr<const int64_t>(indices), g, kernels::pool_dim_h(g),
        kernels::pool_dim_w(g));
  });
}

void avg_pool2d_cuda(const Tensor& out, const Tensor& x, const Pool2dGeometry& g) {
  launch_pool(out, x.dtype(), "avg_pool2d", [&](auto tag, unsigned blocks) {
    using T = typename decltype(tag)::type;
    avg_pool_kernel<T><<<blocks, kThreads, 0, cuda::current_stream()>>>(ptr<T>(out), ptr<const T>(x), g,
                                                                        kernels::pool_dim_h(g), kernels::pool_dim_w(g));
  });
}

void avg_pool2d_backward_cuda(const Tensor& grad_in, const Tensor& grad_out, const Pool2dGeometry& g) {
  launch_pool(grad_in, grad_in.dtype(), "avg_pool2d_backward", [&](auto tag, unsigned blocks) {
    using T = typename decltype(tag)::type;
    avg_pool_backward_kernel<T><<<blocks, kThreads, 0, cuda::current_stream()>>>(
        ptr<T>(grad_in), ptr<const T>(grad_out), g, kernels::pool_dim_h(g), kernels::pool_dim_w(g));
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::max_pool2d_stub, CUDA, &max_pool2d_cuda);
EMBER_REGISTER_KERNEL(native::max_pool2d_backward_stub, CUDA, &max_pool2d_backward_cuda);
EMBER_REGISTER_KERNEL(native::avg_pool2d_stub, CUDA, &avg_pool2d_cuda);
EMBER_REGISTER_KERNEL(native::avg_pool2d_backward_stub, CUDA, &avg_pool2d_backward_cuda);

}  // namespace ember
