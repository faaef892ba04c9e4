// One-pass optimizer updates: each reads param, grad and state once and writes them once.
#pragma once
#include "core/dispatch.h"
#include "core/tensor.h"

namespace ember::native {

struct AdamStepArgs {
  double lr, beta1, beta2, eps, weight_decay;
  bool decoupled;          // AdamW: p -= lr*wd*p; Adam: g += wd*p
  double bias_correction1;  // 1 - beta1^step
  double bias_correction2;  // 1 - beta2^step
  double grad_scale = 1.0;  // grads are multiplied by this first (unscaling)
};
// All tensors contiguous, same shape; param/exp_avg/exp_avg_sq f32 or f64; grad any float.
EMBER_DECLARE_STUB(adam_step_stub, void (*)(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                                            const Tensor& exp_avg_sq, const AdamStepArgs& args));

struct SgdStepArgs {
  double lr, momentum, dampening, weight_decay;
  bool nesterov;
  bool first_step;  // momentum buffer starts as the gradient
};
// momentum_buf may be undefined when momentum == 0.
EMBER_DECLARE_STUB(sgd_step_stub, void (*)(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf,
                                           const SgdStepArgs& args));

void adam_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
               const AdamStepArgs& args);
void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdStepArgs& args);

}  // namespace ember::native
