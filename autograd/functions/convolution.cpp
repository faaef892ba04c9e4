// Convolutions and their backward. conv1d and conv2d run the 2-D convolution on 4-D views of
// their arguments (a unit batch for unbatched input, a unit height for conv1d); conv_transpose2d
// is that convolution's input gradient. So one forward and one backward below serve all three:
// the transpose swaps the roles of the forward and the input gradient, and of x and dy in the
// weight gradient. The backward is itself differentiable (autograd::grad with create_graph).
#include "autograd/functions/convolution_gradients.h"
#include "autograd/node.h"
#include "core/autocast.h"
#include "core/native/convolution.h"
#include "core/native/views.h"
#include "core/ops.h"

namespace ember {
using autograd::Tensors;

namespace {

struct ConvCall {
  const char* node;
  bool transposed;
};

// y = conv(x, w) + b, or y = conv^T(x, w) + b when transposed; x, w and b are the caller's
// tensors, `a` their checked 4-D form.
Tensor convolution(ConvCall call, const Tensor& x, const Tensor& w, const Tensor& b, const native::ConvArgs& a) {
  const Tensor out4 = call.transposed
                          ? native::conv2d_backward_input(a.input, a.weight, a.bias, a.output4_shape, a.params)
                          : native::conv2d(a.input, a.weight, a.bias, a.params);
  Tensor out = native::view(out4, a.output_shape);
  if (!autograd::needs_grad({x, w, b})) return out;
  const bool want_x = x.requires_grad(), want_w = w.requires_grad(), want_b = b.defined() && b.requires_grad();
  // x is read only for dW and w only for dx, so each is saved only when that one is wanted. The
  // formula uses the differentiable convolution gradients: in an ordinary backward (no grad
  // mode) they are the native calls, and under create_graph they record a graph of their own.
  autograd::record(
      call.node, {x, w, b}, {out},
      [call, sx = autograd::save_with_history(want_w ? x : Tensor()),
       sw = autograd::save_with_history(want_x ? w : Tensor()), x_shape = x.shape(), w_shape = w.shape(),
       x4_shape = a.input.shape(), w4_shape = a.weight.shape(), out4_shape = a.output4_shape, p = a.params, want_x,
       want_w, want_b](const Tensors& g) -> Tensors {
        const Tensor g4 = g[0].reshape(out4_shape);
        Tensor gx, gw, gb;
        if (want_x) {
          const Tensor w4 = sw.unpack().reshape(w4_shape);
          gx = call.transposed ? autograd::conv2d_4d(g4, w4, x4_shape, p)
                               : autograd::conv2d_input_grad(g4, w4, x4_shape, p);
          gx = gx.reshape(x_shape);
        }
        if (want_w) {
          const Tensor x4 = sx.unpack().reshape(x4_shape);
          gw = call.transposed ? autograd::conv2d_weight_grad(x4, g4, w4_shape, p)
                               : autograd::conv2d_weight_grad(g4, x4, w4_shape, p);
          gw = gw.reshape(w_shape);
        }
        if (want_b) gb = sum(g4, {0, 2, 3});
        return {gx, gw, gb};
      },
      autograd::Backward::differentiable);
  return out;
}

// Products compute in the autocast dtype, as linear does.
struct LowerInputs {
  Tensor x, w, b;
  LowerInputs(const Tensor& input, const Tensor& weight, const Tensor& bias)
      : x(autocast::to_lower(input)), w(autocast::to_lower(weight)), b(autocast::to_lower(bias)) {}
};

constexpr ConvCall kConv1d{"Conv1dBackward", false};
constexpr ConvCall kConv2d{"Conv2dBackward", false};
constexpr ConvCall kConvTranspose2d{"ConvTranspose2dBackward", true};

}  // namespace

Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, const Shape& stride,
              const ConvPadding& padding, const Shape& dilation, int64_t groups) {
  const LowerInputs l(input, weight, bias);
  return convolution(kConv2d, l.x, l.w, l.b, native::conv2d_args(l.x, l.w, l.b, stride, padding, dilation, groups));
}

Tensor conv1d(const Tensor& input, const Tensor& weight, const Tensor& bias, int64_t stride,
              const ConvPadding& padding, int64_t dilation, int64_t groups) {
  const LowerInputs l(input, weight, bias);
  return convolution(kConv1d, l.x, l.w, l.b, native::conv1d_args(l.x, l.w, l.b, stride, padding, dilation, groups));
}

Tensor conv_transpose2d(const Tensor& input, const Tensor& weight, const Tensor& bias, const Shape& stride,
                        const Shape& padding, const Shape& output_padding, int64_t groups, const Shape& dilation) {
  const LowerInputs l(input, weight, bias);
  return convolution(kConvTranspose2d, l.x, l.w, l.b,
                     native::conv_transpose2d_args(l.x, l.w, l.b, stride, padding, output_padding, groups, dilation));
}

}  // namespace ember
