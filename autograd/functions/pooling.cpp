// Differentiable 2-D pooling. Forward work and the backward kernels are in
// core/native/pooling.h; max pooling keeps the forward's argmax indices, so its backward routes
// each gradient to the very element the forward chose (ties and NaNs included) without
// recomputing the windows. Every pooling is linear in its input given those indices, so each
// gradient is an op of its own, the kernel's value with the forward as its backward (its adjoint):
// pooling can be differentiated any number of times (create_graph).
#include <string>

#include "autograd/functions/composed_gradient.h"
#include "autograd/node.h"
#include "core/native/copy.h"
#include "core/native/pooling.h"
#include "core/ops.h"

namespace ember {
using autograd::Tensors;

namespace {

// The gradient of max pooling for an input of `shape`: grad_out scattered by the indices. Its
// own gradient gathers h at the same indices, plane by plane.
Tensor max_pool2d_grad(const Tensor& grad_out, const Tensor& indices, const Shape& shape, DType dtype,
                       const native::Pool2dGeometry& g) {
  return autograd::linear_gradient(
      "MaxPool2dGradBackward", grad_out,
      native::max_pool2d_backward(native::to_dtype(grad_out, dtype), indices, shape, g),
      [indices, g, out_shape = grad_out.shape()](const Tensor& h) {
        const Tensor planes = h.reshape({g.planes, g.in_h * g.in_w});
        return gather(planes, 1, indices.reshape({g.planes, g.out_h * g.out_w})).reshape(out_shape);
      });
}

// op: "AvgPool2d" or "AdaptiveAvgPool2d", naming the nodes op + "Backward" and op + "GradBackward".
Tensor avg_pool(const Tensor& input, const native::Pool2dGeometry& g, const char* op);

// The gradient of average pooling (the forward's adjoint), whose own gradient is the forward.
Tensor avg_pool_grad(const Tensor& grad_out, const Shape& shape, DType dtype, const native::Pool2dGeometry& g,
                     const char* op) {
  return autograd::linear_gradient(std::string(op) + "GradBackward", grad_out,
                                   native::avg_pool2d_backward(native::to_dtype(grad_out, dtype), shape, g),
                                   [g, op](const Tensor& h) { return avg_pool(h, g, op); });
}

// Average pooling of either kind: the backward needs only the geometry and the input's shape.
Tensor avg_pool(const Tensor& input, const native::Pool2dGeometry& g, const char* op) {
  Tensor out = native::avg_pool2d(input, g);
  if (autograd::needs_grad({input})) {
    const Shape shape = input.shape();
    const DType dtype = input.dtype();
    autograd::record(
        std::string(op) + "Backward", {input}, {out},
        [shape, dtype, g, op](const Tensors& gr) -> Tensors { return {avg_pool_grad(gr[0], shape, dtype, g, op)}; },
        autograd::Backward::differentiable);
  }
  return out;
}

}  // namespace

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
    autograd::record(
        "MaxPool2dBackward", {input}, {r.out},
        [indices, shape, dtype, g](const Tensors& gr) -> Tensors {
          return {max_pool2d_grad(gr[0], indices, shape, dtype, g)};
        },
        autograd::Backward::differentiable);
  }
  return r.out;
}

Tensor avg_pool2d(const Tensor& input, const Shape& kernel_size, const Shape& stride, const Shape& padding,
                  bool ceil_mode, bool count_include_pad) {
  return avg_pool(input,
                  native::pool2d_geometry(input, {kernel_size, stride, padding, {1, 1}, ceil_mode, count_include_pad},
                                          "avg_pool2d"),
                  "AvgPool2d");
}

Tensor adaptive_avg_pool2d(const Tensor& input, const Shape& output_size) {
  return avg_pool(input, native::adaptive_pool2d_geometry(input, output_size, "adaptive_avg_pool2d"),
                  "AdaptiveAvgPool2d");
}

}  // namespace ember
