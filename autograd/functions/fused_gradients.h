// The gradients of the fused ops (core/ops.h, "fused") composed from differentiable ops, out of
// the composed gradients of the ops each one fuses (gelu's unary_grad, layer_norm_gradients,
// softmax_grad, dropout_grad, matmul): the history fused.cpp gives its backward kernels' values
// under create_graph (composed_gradient.h), so the fused ops can be differentiated twice. A
// dropout's mask is the forward's, a constant. Each returns its gradients in the order of the
// op's inputs.
#pragma once
#include "autograd/functions/normalization_gradients.h"
#include "autograd/node.h"

namespace ember::autograd {

// y = gelu(x + bias), bias [C] added to every row: {dx, dbias}.
Tensors bias_gelu_gradients(const Tensor& g, const Tensor& x, const Tensor& bias, bool tanh_approx);

// The gradients of h = dropout(x + x_bias) + residual from dh: {dx, dresidual, dx_bias}. keep:
// the dropout's mask (bool, h's shape) or undefined; x_bias_shape empty without an x bias.
Tensors add_dropout_gradients(const Tensor& dh, const Tensor& keep, double dropout_scale, const Shape& x_bias_shape);

// y = layer_norm(h) * weight + bias with h as above, given h with the history of its inputs (a
// node whose backward is add_dropout_gradients): {dx, dresidual, dweight, dbias, dx_bias}.
// wanted.dx stands for any of the first three.
Tensors add_layer_norm_gradients(const Tensor& g, const Tensor& h, const Tensor& keep, double dropout_scale,
                                 const Shape& x_bias_shape, const Shape& normalized_shape, const Tensor& weight,
                                 double eps, NormGradsWanted wanted);

// y = dropout(softmax(x * scale + mask)) over the last dim: {dx, dmask}; mask broadcastable to x
// or undefined; keep: the dropout's mask (bool, x's shape) or undefined.
Tensors scaled_masked_softmax_gradients(const Tensor& g, const Tensor& x, const Tensor& mask, const Tensor& keep,
                                        double scale, double dropout_scale);

// out = dropout(softmax(q k^T * scale + mask)) v over the last two dims, leading dims
// broadcasting: {dq, dk, dv}. mask: additive and constant (a causal one included), or undefined;
// keep: the dropout's mask (bool, the scores' shape) or undefined.
Tensors attention_gradients(const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                            const Tensor& keep, double scale, double dropout_scale);

// packed_self_attention: qkv [B, L, 3E] holding [q | k | v], num_heads heads each; the same
// attention per head, the mask broadcasting to [B, heads, L, L]. Its gradient dqkv.
Tensor packed_attention_gradient(const Tensor& g, const Tensor& qkv, int64_t num_heads, const Tensor& mask,
                                 const Tensor& keep, double scale, double dropout_scale);

}  // namespace ember::autograd
