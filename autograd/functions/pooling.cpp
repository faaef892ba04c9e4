// Differentiable 2-D pooling. Forward work and the backward kernels are in
// core/native/pooling.h; max pooling keeps the forward's argmax indices, so its backward routes
// each gradient to the very element the forward chose (ties and NaNs included) without
// recomputing the windows.
#include "autograd/node.h"
#include "core/native/copy.h"
#include "core/native/pooling.h"
#include "core/ops.h"

namespace ember {
using autograd::Tensors;

Tensor max_pool2d(const Tensor& input, const Shape& kernel_size, const Shape& stride, const Shape& padding,
                  const Shape& dilation, bool ceil_mode) {
  const native::Pool2dGeometry g =
      native::pool2d_geometry(input, {kernel_size, stride, padding, dilation, ceil_mode, true}, "max_pool2d");
  native::MaxPool2dResult r = native::max_pool2d(input, g);
  if (autograd::needs_grad({input})) {
    // the indices were made for this backward alone, so they need no autograd::save
    const Tensor indices = r.indices;
    const Shape shape = input.shape();
    const DType dtype = input.dtype();
    autograd::record("MaxPool2dBackward", {input}, {r.out}, [indices, shape, dtype, g](const Tensors& gr) -> Tensors {
      return {native::max_pool2d_backward(native::to_dtype(gr[0], dtype), indices, shape, g)};
    });
  }
  return r.out;
}

namespace {

// Average pooling of either kind: the backward needs only the geometry and the input's shape.
Tensor avg_pool(const Tensor& input, const native::Pool2dGeometry& g, const char* node) {
  Tensor out = native::avg_pool2d(input, g);
  if (autograd::needs_grad({input})) {
    const Shape shape = input.shape();
    const DType dtype = input.dtype();
    autograd::record(node, {input}, {out}, [shape, dtype, g](const Tensors& gr) -> Tensors {
      return {native::avg_pool2d_backward(native::to_dtype(gr[0], dtype), shape, g)};
    });
  }
  return out;
}

}  // namespace

Tensor avg_pool2d(const Tensor& input, const Shape& kernel_size, const Shape& stride, const Shape& padding,
                  bool ceil_mode, bool count_include_pad) {
  return avg_pool(input,
                  native::pool2d_geometry(input, {kernel_size, stride, padding, {1, 1}, ceil_mode, count_include_pad},
                                          "avg_pool2d"),
                  "AvgPool2dBackward");
}

Tensor adaptive_avg_pool2d(const Tensor& input, const Shape& output_size) {
  return avg_pool(input, native::adaptive_pool2d_geometry(input, output_size, "adaptive_avg_pool2d"),
                  "AdaptiveAvgPool2dBackward");
}

}  // namespace ember
