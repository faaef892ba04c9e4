// x^3 as an op of its own whose backward formula is recorded as Backward::first_order: right
// gradients, read from x without its history. No op of the library is first-order any more; this
// one keeps the engine's refusal of a second backward through such a formula tested.
#pragma once
#include "autograd/node.h"
#include "core/grad_mode.h"
#include "core/ops.h"

namespace ember::testing {

inline Tensor first_order_cube(const Tensor& x) {
  Tensor y;
  {
    NoGradGuard no_grad;
    y = mul(mul(x, x), x);
  }
  if (autograd::needs_grad({x})) {
    const autograd::SavedTensor saved = autograd::save(x);
    autograd::record("FirstOrderCubeBackward", {x}, {y}, [saved](const autograd::Tensors& g) -> autograd::Tensors {
      const Tensor xv = saved.unpack();
      return {mul(g[0], mul(mul(xv, xv), 3.0))};
    });
  }
  return y;
}

}  // namespace ember::testing
