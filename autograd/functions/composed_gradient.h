// Gradients whose value comes from a fused kernel and whose history is built from differentiable
// ops, so a backward with create_graph can differentiate them again while their values stay the
// kernel's bits. The history is recorded only under grad mode with an input that requires grad (a
// backward with create_graph); in an ordinary backward a formula costs what its kernel costs.
#pragma once
#include <functional>
#include <string>

#include "autograd/node.h"

namespace ember::autograd {

// value, with a node `name` whose backward passes its gradient on to `composed` unchanged; value
// itself when composed is undefined or has no history. composed must have value's shape (it is
// cast to value's dtype).
Tensor with_history_of(const char* name, const Tensor& value, const Tensor& composed);

// values, each with the history of its counterpart in composed(), which runs only when grad mode
// is on and one of `inputs` requires grad. composed() may return fewer tensors, or undefined
// ones: those values stay as they are.
Tensors with_composed_history(const char* name, Tensors values, const Tensors& inputs,
                              const std::function<Tensors()>& composed);

// value: a kernel's result that is linear in grad_out alone (its other operands, indices or a
// mask, are constants). Records node `name` on it whose backward is adjoint(h), the transposed
// map built from differentiable ops (the forward op itself, typically), in grad_out's dtype.
template <class Adjoint>
Tensor linear_gradient(std::string name, const Tensor& grad_out, Tensor value, Adjoint adjoint) {
  if (!needs_grad({grad_out})) return value;
  record(
      std::move(name), {grad_out}, {value},
      [adjoint, dtype = grad_out.dtype()](const Tensors& h) -> Tensors {
        const Tensor t = adjoint(h[0]);
        return {t.dtype() == dtype ? t : t.to(dtype)};
      },
      Backward::differentiable);
  return value;
}

}  // namespace ember::autograd
