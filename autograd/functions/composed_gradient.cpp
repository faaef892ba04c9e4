// The fused value with a composed history: an identity node from the value to the composed
// tensor, so the engine differentiates the composed ops when it differentiates the value.
#include "autograd/functions/composed_gradient.h"

#include "core/error.h"

namespace ember::autograd {

Tensor with_history_of(const char* name, const Tensor& value, const Tensor& composed) {
  if (!value.defined() || !composed.defined() || !composed.requires_grad()) return value;
  EMBER_CHECK(composed.shape() == value.shape(), name, ": the composed gradient of shape ", composed.shape(),
              " does not match the fused one of shape ", value.shape());
  const Tensor source = composed.to(value.dtype());
  // The fused kernel's tensor is the result; it is shared with nothing that has history.
  Tensor result = value.detach();
  record(name, {source}, {result}, [](const Tensors& h) -> Tensors { return {h[0]}; }, Backward::differentiable);
  return result;
}

Tensors with_composed_history(const char* name, Tensors values, const Tensors& inputs,
                              const std::function<Tensors()>& composed) {
  if (!needs_grad(inputs)) return values;
  const Tensors history = composed();
  for (size_t i = 0; i < values.size() && i < history.size(); ++i)
    values[i] = with_history_of(name, values[i], history[i]);
  return values;
}

}  // namespace ember::autograd
