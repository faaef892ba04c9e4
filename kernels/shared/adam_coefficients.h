// The per-step constants of the Adam/AdamW update, shared by the CPU and CUDA kernels so both
// round them identically: formed in double and rounded once to the compute type, as PyTorch
// does (1 - 0.999f in float would already be off by 1e-5 relative).
#pragma once
#include <cmath>

#include "core/native/fused_optim.h"

namespace ember::kernels {

template <typename A>
struct AdamCoefficients {
  A b1, b2, one_minus_b1, one_minus_b2, step_size, bc2_sqrt, eps, scale, decay, l2;
};

template <typename A>
AdamCoefficients<A> adam_coefficients(const native::AdamStepArgs& a) {
  return {A(a.beta1),
          A(a.beta2),
          A(1.0 - a.beta1),
          A(1.0 - a.beta2),
          A(a.lr / a.bias_correction1),
          A(std::sqrt(a.bias_correction2)),
          A(a.eps),
          A(a.grad_scale),
          A(a.decoupled ? 1.0 - a.lr * a.weight_decay : 1.0),
          A(a.decoupled ? 0.0 : a.weight_decay)};
}

}  // namespace ember::kernels
