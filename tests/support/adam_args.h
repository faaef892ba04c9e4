// The Adam step arguments the multi-tensor Adam tests (CPU and CUDA) use: lr 1e-2, betas
// (0.9, 0.999), eps 1e-8, bias corrections for `step`.
#pragma once
#include <cmath>

#include "core/native/fused_optim.h"

namespace ember::testing {

inline native::AdamStepArgs adam_test_args(bool decoupled, double weight_decay, double grad_scale, int step) {
  native::AdamStepArgs a{};
  a.lr = 1e-2;
  a.beta1 = 0.9;
  a.beta2 = 0.999;
  a.eps = 1e-8;
  a.weight_decay = weight_decay;
  a.decoupled = decoupled;
  a.bias_correction1 = 1.0 - std::pow(a.beta1, step);
  a.bias_correction2 = 1.0 - std::pow(a.beta2, step);
  a.grad_scale = grad_scale;
  return a;
}

}  // namespace ember::testing
