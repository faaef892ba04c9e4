// Backward of the three bilinear convolution ops, from <conv(x, w), g> = <x, dx(g, w)> =
// <w, dw(g, x)>: differentiating one of the three in either argument gives another of them.
#include "autograd/functions/convolution_gradients.h"

#include "autograd/node.h"

namespace ember::autograd {
namespace {

// p with padding_end giving y_shape's height and width: the kernels read only padding_begin and
// take the sizes from their tensors, so this trims the rows and columns past y_shape.
native::Conv2dParams with_output_size(native::Conv2dParams p, const Shape& x_shape, const Shape& w_shape,
                                      const Shape& y_shape) {
  for (size_t i = 0; i < 2; ++i) {
    const int64_t span = p.dilation[i] * (w_shape[2 + i] - 1) + 1;
    p.padding_end[i] = (y_shape[2 + i] - 1) * p.stride[i] + span - x_shape[2 + i] - p.padding_begin[i];
  }
  return p;
}

// out = op(a, b), bilinear: records its backward when a or b needs grad. With h the gradient of
// out, a's gradient is grad_a(h, b) and b's is grad_b(a, h), both differentiable ops; each
// factor is saved (with its history) only when the other one's gradient is wanted.
template <class GradA, class GradB>
Tensor bilinear(const char* name, const Tensor& a, const Tensor& b, Tensor out, GradA grad_a, GradB grad_b) {
  if (!needs_grad({a, b})) return out;
  const bool want_a = a.requires_grad(), want_b = b.requires_grad();
  record(
      name, {a, b}, {out},
      [sa = save_with_history(want_b ? a : Tensor()), sb = save_with_history(want_a ? b : Tensor()), grad_a, grad_b,
       want_a, want_b](const Tensors& h) -> Tensors {
        return {want_a ? grad_a(h[0], sb.unpack()) : Tensor(), want_b ? grad_b(sa.unpack(), h[0]) : Tensor()};
      },
      Backward::differentiable);
  return out;
}

}  // namespace

Tensor conv2d_4d(const Tensor& x, const Tensor& w, const Shape& y_shape, const native::Conv2dParams& p) {
  // h, the gradient of y: d/dx = dx(h, w), d/dw = dw(h, x).
  return bilinear(
      "Conv2dNoBiasBackward", x, w, native::conv2d(x, w, Tensor(), with_output_size(p, x.shape(), w.shape(), y_shape)),
      [x_shape = x.shape(), p](const Tensor& h, const Tensor& weight) {
        return conv2d_input_grad(h, weight, x_shape, p);
      },
      [w_shape = w.shape(), p](const Tensor& input, const Tensor& h) {
        return conv2d_weight_grad(h, input, w_shape, p);
      });
}

Tensor conv2d_input_grad(const Tensor& g, const Tensor& w, const Shape& x_shape, const native::Conv2dParams& p) {
  // h, the gradient of dx, plays x: d/dg = conv(h, w), d/dw = dw(g, h).
  return bilinear(
      "Conv2dInputGradBackward", g, w, native::conv2d_backward_input(g, w, Tensor(), x_shape, p),
      [g_shape = g.shape(), p](const Tensor& h, const Tensor& weight) { return conv2d_4d(h, weight, g_shape, p); },
      [w_shape = w.shape(), p](const Tensor& grad, const Tensor& h) {
        return conv2d_weight_grad(grad, h, w_shape, p);
      });
}

Tensor conv2d_weight_grad(const Tensor& g, const Tensor& x, const Shape& w_shape, const native::Conv2dParams& p) {
  // k, the gradient of dw, plays w: d/dg = conv(x, k), d/dx = dx(g, k).
  return bilinear(
      "Conv2dWeightGradBackward", g, x, native::conv2d_backward_weight(g, x, w_shape, p),
      [g_shape = g.shape(), p](const Tensor& k, const Tensor& input) { return conv2d_4d(input, k, g_shape, p); },
      [x_shape = x.shape(), p](const Tensor& grad, const Tensor& k) { return conv2d_input_grad(grad, k, x_shape, p); });
}

}  // namespace ember::autograd
