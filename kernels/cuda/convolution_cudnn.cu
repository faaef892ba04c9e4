// CUDA convolutions: the three kernels of core/native/convolution.h on cuDNN's graph API
// (kernels/cuda/cudnn_conv_plans.h), with the bias added per channel by a kernel of Ember's
// own afterwards.
//
// cuDNN states a convolution by its input, weight and output sizes, which must satisfy
// Ho = (H + pre + post - span) / stride + 1 exactly. Ember's geometry has an end padding that
// only decides the output size, and may be negative (conv_transpose2d's output_padding
// beyond its padding), so the end padding passed to cuDNN is the one the rows actually reached
// need: reach = (Ho - 1) * stride + span - pre rows of the padded input. When reach is below H,
// the last input rows are never read: the input is described to cuDNN as a view of its first
// `reach` rows (the tensor's own strides), and an input gradient is zeroed first so those rows
// read zero.
#include <algorithm>
#include <cstdint>

#include "core/native/convolution.h"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/cuda/cudnn_conv_plans.h"
#include "kernels/cuda/device_types.cuh"
#include "kernels/cuda/strided_indexer.cuh"

namespace ember {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void add_channel_bias_kernel(T* out, const T* bias, int64_t channels, int64_t plane, int64_t total) {
  using C = cuda::Acc<T>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = C::store(C::load(out[i]) + C::load(bias[(i / plane) % channels]));
}

// out [N, C, H, W] += bias[c] on channel c.
void add_channel_bias(const Tensor& out, const Tensor& bias) {
  const int64_t total = out.numel(), channels = out.shape()[1], plane = out.shape()[2] * out.shape()[3];
  cuda::visit_device_floating(out.dtype(), "conv2d bias", [&](auto tag) {
    using T = typename decltype(tag)::type;
    add_channel_bias_kernel<T><<<cuda::grid_for(total, kThreads), kThreads, 0, cuda::current_stream()>>>(
        static_cast<T*>(out.raw_data()), static_cast<const T*>(bias.raw_data()), channels, plane, total);
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

std::array<int64_t, 4> dims_of(const Tensor& t) {
  const Shape& s = t.shape();
  return {s[0], s[1], s[2], s[3]};
}

int64_t alignment_of(std::initializer_list<const Tensor*> tensors) {
  int64_t align = 16;
  for (const Tensor* t : tensors)
    while (align > 1 && reinterpret_cast<uintptr_t>(t->raw_data()) % uintptr_t(align) != 0) align /= 2;
  return align;
}

// The problem of one pass: x the convolution's input (or input gradient), w its weight (or
// weight gradient), y its output (or output gradient). Sets `narrowed` when x is described as
// a view of its first rows or columns (see the top of the file).
cuda::CudnnConvProblem problem_for(cuda::CudnnConvPass pass, const Tensor& x, const Tensor& w, const Tensor& y,
                                   const native::Conv2dParams& p, bool& narrowed) {
  cuda::CudnnConvProblem problem;
  problem.pass = pass;
  problem.dtype = x.dtype();
  problem.x_dims = dims_of(x);
  problem.x_strides = {problem.x_dims[1] * problem.x_dims[2] * problem.x_dims[3], problem.x_dims[2] * problem.x_dims[3],
                       problem.x_dims[3], 1};
  problem.w_dims = dims_of(w);
  problem.y_dims = dims_of(y);
  problem.stride = p.stride;
  problem.pre_padding = p.padding_begin;
  problem.dilation = p.dilation;
  problem.alignment = alignment_of({&x, &w, &y});
  narrowed = false;
  for (size_t i = 0; i < 2; ++i) {
    const int64_t span = p.dilation[i] * (problem.w_dims[2 + i] - 1) + 1;
    const int64_t reach = (problem.y_dims[2 + i] - 1) * p.stride[i] + span - p.padding_begin[i];
    const int64_t size = problem.x_dims[2 + i];
    EMBER_CHECK(reach >= 1, "conv2d on cuDNN: no input element reaches the output (input ", x.shape(), ", weight ",
                w.shape(), ", output ", y.shape(), ")");
    problem.post_padding[i] = std::max<int64_t>(reach - size, 0);
    if (reach < size) {
      problem.x_dims[2 + i] = reach;
      narrowed = true;
    }
  }
  return problem;
}

void conv2d_cuda(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& b, const native::Conv2dParams& p) {
  cuda::DeviceGuard guard(out.device(), "conv2d");
  bool narrowed = false;
  const auto problem = problem_for(cuda::CudnnConvPass::Forward, x, w, out, p, narrowed);
  cuda::run_cudnn_conv(problem, x.raw_data(), w.raw_data(), out.raw_data());
  if (b.defined()) add_channel_bias(out, b);
}

void conv2d_backward_input_cuda(const Tensor& dx, const Tensor& dy, const Tensor& w, const Tensor& b,
                                const native::Conv2dParams& p) {
  cuda::DeviceGuard guard(dx.device(), "conv2d backward (input)");
  bool narrowed = false;
  const auto problem = problem_for(cuda::CudnnConvPass::BackwardData, dx, w, dy, p, narrowed);
  if (narrowed)
    EMBER_CUDA_CHECK(cudaMemsetAsync(dx.raw_data(), 0, size_t(dx.numel()) * dtype_size(dx.dtype()),
                                     cuda::current_stream()));
  cuda::run_cudnn_conv(problem, dx.raw_data(), w.raw_data(), dy.raw_data());
  if (b.defined()) add_channel_bias(dx, b);
}

void conv2d_backward_weight_cuda(const Tensor& dw, const Tensor& dy, const Tensor& x, const native::Conv2dParams& p) {
  cuda::DeviceGuard guard(dw.device(), "conv2d backward (weight)");
  if (dy.numel() == 0) {  // an empty batch: no contribution
    EMBER_CUDA_CHECK(cudaMemsetAsync(dw.raw_data(), 0, size_t(dw.numel()) * dtype_size(dw.dtype()),
                                     cuda::current_stream()));
    return;
  }
  bool narrowed = false;
  const auto problem = problem_for(cuda::CudnnConvPass::BackwardFilter, x, dw, dy, p, narrowed);
  cuda::run_cudnn_conv(problem, x.raw_data(), dw.raw_data(), dy.raw_data());
}

}  // namespace

EMBER_REGISTER_KERNEL(native::conv2d_stub, CUDA, &conv2d_cuda);
EMBER_REGISTER_KERNEL(native::conv2d_backward_input_stub, CUDA, &conv2d_backward_input_cuda);
EMBER_REGISTER_KERNEL(native::conv2d_backward_weight_stub, CUDA, &conv2d_backward_weight_cuda);

}  // namespace ember
