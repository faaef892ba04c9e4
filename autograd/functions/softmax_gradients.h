// The gradients of softmax, log_softmax and cross_entropy as differentiable ops of their own
// (double backward under create_graph). The value of each is always its fused native kernel, so
// create_graph changes what is recorded and never the first-order numbers; its backward is
// composed from differentiable ops. Under no-grad mode, as in an ordinary backward pass, each is
// its native call and nothing more.
//   softmax_grad(g, y, dim)      dx = y (g - sum(g y))          y = softmax(x, dim)
//   log_softmax_grad(g, y, dim)  dx = g - exp(y) sum(g)         y = log_softmax(x, dim)
//   cross_entropy_grad(...)      dlogits = w (softmax(logits) - (1 - eps) onehot - eps / C)
#pragma once
#include "core/native/nn_functional.h"

namespace ember::autograd {

Tensor softmax_grad(const Tensor& g, const Tensor& y, int64_t dim);
Tensor log_softmax_grad(const Tensor& g, const Tensor& y, int64_t dim);

// grad_loss: the gradient of cross_entropy's loss. logits: the op's input, with its history (its
// second derivative recomputes the softmax from them); saved: what the forward kept for the
// native kernel (the canonical logits without history, target, row log-sum-exps, count).
Tensor cross_entropy_grad(const Tensor& grad_loss, const Tensor& logits, const native::CrossEntropyResult& saved,
                          const native::CrossEntropyArgs& args);

}  // namespace ember::autograd
