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

// t in dtype (differentiably).
Tensor in_dtype(const Tensor& t, DType dtype) { return t.dtype() == dtype ? t : t.to(dtype); }

// softmax(x * scale + mask) over the last dim.
Tensor masked_softmax(const Tensor& x, const Tensor& mask, double scale) {
  const Tensor scores = mul(x, scale);
  return softmax(mask.defined() ? add(scores, mask) : scores, -1);
}

// The gradient of the masked scores x * scale + mask from g, the gradient of dropout(probs).
Tensor masked_scores_gradient(const Tensor& g, const Tensor& probs, const Tensor& keep, double dropout_scale) {
  Tensor gp = in_dtype(g, probs.dtype());
  if (keep.defined()) gp = dropout_grad(gp, mask_like(keep, gp), dropout_scale);
  return softmax_grad(gp, probs, -1);
}

}  // namespace

Tensors bias_gelu_gradients(const Tensor& g, const Tensor& x, const Tensor& bias, bool tanh_approx) {
  const Tensor u = add(x, bias);
  const Tensor dx = unary_grad("GeluBackward", tanh_approx ? native::UnaryOp::GeluTanh : native::UnaryOp::Gelu,
                               in_dtype(g, u.dtype()), u);
  return {dx, sum_to_shape(dx, bias.shape())};
}

Tensors add_dropout_gradients(const Tensor& dh, const Tensor& keep, double dropout_scale, const Shape& x_bias_shape) {
  const Tensor dx = keep.defined() ? dropout_grad(dh, mask_like(keep, dh), dropout_scale) : dh;
  return {dx, dh, x_bias_shape.empty() ? Tensor() : sum_to_shape(dx, x_bias_shape)};
}

Tensors add_layer_norm_gradients(const Tensor& g, const Tensor& h, const Tensor& keep, double dropout_scale,
                                 const Shape& x_bias_shape, const Shape& normalized_shape, const Tensor& weight,
                                 double eps, NormGradsWanted wanted) {
  const Tensors norm = layer_norm_gradients(in_dtype(g, h.dtype()), h, normalized_shape,
                                            weight, eps, wanted);
  if (norm.empty()) return {};  // an empty input
  const Tensors inputs = wanted.dx ? add_dropout_gradients(norm[0], keep, dropout_scale, x_bias_shape) : Tensors(3);
  return {inputs[0], inputs[1], norm[1], norm[2], inputs[2]};
}

Tensors scaled_masked_softmax_gradients(const Tensor& g, const Tensor& x, const Tensor& mask, const Tensor& keep,
                                        double scale, double dropout_scale) {
  const Tensor ds = masked_scores_gradient(g, masked_softmax(x, mask, scale), keep, dropout_scale);
  return {mul(ds, scale), mask.defined() ? sum_to_shape(ds, mask.shape()) : Tensor()};
}

Tensors attention_gradients(const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                            const Tensor& keep, double scale, double dropout_scale) {
  // in the probabilities' dtype (a lower-precision q with an f32 mask gives f32 ones)
  const Tensor probs = masked_softmax(matmul(q, k.transpose(-2, -1)), mask, scale);
  const DType dt = probs.dtype();
  const Tensor qc = in_dtype(q, dt), kc = in_dtype(k, dt), vc = in_dtype(v, dt), gc = in_dtype(g, dt);
  const Tensor kept = keep.defined() ? dropout_grad(probs, mask_like(keep, probs), dropout_scale) : probs;
  const Tensor ds = mul(masked_scores_gradient(matmul(gc, vc.transpose(-2, -1)), probs, keep, dropout_scale), scale);
  return {sum_to_shape(matmul(ds, kc), q.shape()), sum_to_shape(matmul(ds.transpose(-2, -1), qc), k.shape()),
          sum_to_shape(matmul(kept.transpose(-2, -1), gc), v.shape())};
}

Tensor packed_attention_gradient(const Tensor& g, const Tensor& qkv, int64_t num_heads, const Tensor& mask,
                                 const Tensor& keep, double scale, double dropout_scale) {
  const int64_t b = qkv.size(0), len = qkv.size(1), e = qkv.size(2) / 3, d = e / num_heads;
  // [B, L, E] <-> [B, heads, L, D]
  auto heads = [&](const Tensor& t) { return t.reshape({b, len, num_heads, d}).transpose(1, 2); };
  auto merged = [&](const Tensor& t) { return t.transpose(1, 2).reshape({b, len, e}); };
  const Tensors dqkv = attention_gradients(heads(g), heads(qkv.narrow(2, 0, e)), heads(qkv.narrow(2, e, e)),
                                           heads(qkv.narrow(2, 2 * e, e)), mask, keep, scale, dropout_scale);
  return cat({merged(dqkv[0]), merged(dqkv[1]), merged(dqkv[2])}, 2);
}

}  // namespace ember::autograd
