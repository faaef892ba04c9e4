// The fused ops' composed gradients: each is the chain rule through the composed gradients of the
// ops it fuses, so no formula here is new.
#include "autograd/functions/fused_gradients.h"

#include "autograd/functions/dropout_gradient.h"
#include "autograd/functions/elementwise_gradients.h"
#include "autograd/functions/softmax_gradients.h"
#include "core/native/views.h"
#include "core/ops.h"

namespace ember::autograd {
namespace {

// keep (no history) in the shape of t, or undefined.
Tensor mask_like(const Tensor& keep, const Tensor& t) {
  return keep.defined() ? native::reshape(keep, t.shape()) : keep;
}

}  // namespace

Tensor sum_to_shape(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  const int64_t lead = g.dim() - int64_t(shape.size());
  Shape dims;
  for (int64_t i = 0; i < g.dim(); ++i)
    if (i < lead || (shape[size_t(i - lead)] == 1 && g.shape()[size_t(i)] != 1)) dims.push_back(i);
  const Tensor s = dims.empty() ? g : sum(g, dims, /*keepdim=*/true);
  return s.reshape(shape);
}

Tensors bias_gelu_gradients(const Tensor& g, const Tensor& x, const Tensor& bias, bool tanh_approx) {
  const Tensor u = add(x, bias);
  const Tensor dx = unary_grad("GeluBackward", tanh_approx ? native::UnaryOp::GeluTanh : native::UnaryOp::Gelu,
                               g.dtype() == u.dtype() ? g : g.to(u.dtype()), u);
  return {dx, sum_to_shape(dx, bias.shape())};
}

Tensors add_dropout_gradients(const Tensor& dh, const Tensor& keep, double dropout_scale, const Shape& x_bias_shape) {
  const Tensor dx = keep.defined() ? dropout_grad(dh, mask_like(keep, dh), dropout_scale) : dh;
  return {dx, dh, x_bias_shape.empty() ? Tensor() : sum_to_shape(dx, x_bias_shape)};
}

Tensors add_layer_norm_gradients(const Tensor& g, const Tensor& h, const Tensor& keep, double dropout_scale,
                                 const Shape& x_bias_shape, const Shape& normalized_shape, const Tensor& weight,
                                 double eps, NormGradsWanted wanted) {
  const Tensors norm = layer_norm_gradients(g.dtype() == h.dtype() ? g : g.to(h.dtype()), h, normalized_shape,
                                            weight, eps, wanted);
  if (norm.empty()) return {};  // an empty input
  const Tensors inputs = wanted.dx ? add_dropout_gradients(norm[0], keep, dropout_scale, x_bias_shape) : Tensors(3);
  return {inputs[0], inputs[1], norm[1], norm[2], inputs[2]};
}

Tensors scaled_masked_softmax_gradients(const Tensor& g, const Tensor& x, const Tensor& mask, const Tensor& keep,
                                        double scale, double dropout_scale) {
  Tensor scores = mul(x, scale);
  if (mask.defined()) scores = add(scores, mask);
  const Tensor probs = softmax(scores, -1);
  Tensor gp = g.dtype() == probs.dtype() ? g : g.to(probs.dtype());
  if (keep.defined()) gp = dropout_grad(gp, mask_like(keep, gp), dropout_scale);
  const Tensor ds = softmax_grad(gp, probs, -1);
  return {mul(ds, scale), mask.defined() ? sum_to_shape(ds, mask.shape()) : Tensor()};
}

}  // namespace ember::autograd
