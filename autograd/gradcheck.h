// Finite-difference check of backward formulas, in double precision.
#pragma once
#include <functional>
#include <string>

#include "autograd/node.h"

namespace ember {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-5;
  double rtol = 1e-3;
};

struct GradcheckResult {
  bool ok = true;
  std::string message;  // first mismatch: which input, which element, analytic vs numeric
  explicit operator bool() const { return ok; }
};

// fn maps `inputs` (f64 tensors; those with requires_grad are checked) to outputs. Compares
// the Jacobian from backward against central differences, element by element.
GradcheckResult gradcheck(const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& fn,
                          const std::vector<Tensor>& inputs, GradcheckOptions opt = {});

// Second order: gradcheck of (inputs, v) -> autograd::grad(fn(inputs), inputs, v, create_graph)
// over the inputs that require grad, v being fixed seeds for fn's outputs (themselves checked as
// inputs), so the backward formulas' own backward meets finite differences of the first-order
// gradient. An input the gradient does not reach counts as a zero gradient.
GradcheckResult gradgradcheck(const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& fn,
                              const std::vector<Tensor>& inputs, GradcheckOptions opt = {});

}  // namespace ember
