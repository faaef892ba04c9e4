// dropout's gradient g * mask * scale with the mask fixed by the forward, as a differentiable op
// (double backward under create_graph): dropout's own backward, and the composed gradients of the
// fused ops that drop (fused_gradients.h).
#pragma once
#include "autograd/node.h"

namespace ember::autograd {

// mask: bool, g's shape; scale: 1 / (1 - p).
Tensor dropout_grad(const Tensor& g, const Tensor& mask, double scale);

}  // namespace ember::autograd
