// One-pass optimizer updates: each reads param, grad and state once and writes them once.
#pragma once
#include <vector>

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

// One parameter of a multi-tensor Adam step and its optimizer state.
struct AdamTensors {
  Tensor param, grad, exp_avg, exp_avg_sq;
};
// The Adam step of adam_step_stub over many parameters at once, each element updated exactly as
// adam_step would (bit-identical results). Every entry meets adam_step's contract; all entries
// share one device, one parameter dtype (also that of the state), one gradient dtype and args,
// no two parameters share memory, and none is empty. Lets CUDA update a whole list in a few
// launches instead of one per parameter.
EMBER_DECLARE_STUB(adam_multi_step_stub, void (*)(const std::vector<AdamTensors>& tensors, const AdamStepArgs& args));

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
// Checks the contract of adam_multi_step_stub (skipping empty parameters) and dispatches.
void adam_multi_step(const std::vector<AdamTensors>& tensors, const AdamStepArgs& args);
void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdStepArgs& args);

}  // namespace ember::native
