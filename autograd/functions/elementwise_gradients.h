// The gradient of a unary op, grad_in = grad_out * f'(saved), as a differentiable op of its own
// (double backward under create_graph). Its value is always the fused native kernel, so
// create_graph changes what is recorded and never the first-order numbers; its backward is
// unary_grad again for grad_out (it is linear there) and grad_out * f''(saved), composed from
// differentiable ops, for saved. Under no-grad mode, as in an ordinary backward pass, it is the
// native call and nothing more.
#pragma once
#include "core/native/elementwise.h"

namespace ember::autograd {

// True when f'' is zero, so the gradient need not be differentiated in `saved` (relu,
// leaky_relu, abs, clamp, and pow with exponent 0 or 1): such ops save their tensor without history.
bool second_derivative_is_zero(native::UnaryOp op, native::UnaryParams p);

// saved: the op's output where native::backward_uses_output(op), else its input. node: the name
// of the node whose formula this is; the one recorded for its own backward adds "Backward".
Tensor unary_grad(const char* node, native::UnaryOp op, const Tensor& grad_out, const Tensor& saved,
                  native::UnaryParams p = {});

// g summed over the dims that broadcasting added or expanded to reach g's shape from `shape`.
Tensor sum_to_shape(const Tensor& g, const Shape& shape);

}  // namespace ember::autograd
