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

// ---- row-sparse gradients (core/sparse_grad.h) read as they are
// A [R, D] parameter whose gradient is `row_values` [k, D] at the rows `row_index` (int64 [k] on
// the CPU, ascending, distinct, each in [0, R)) and zero elsewhere. Each step updates every row
// exactly as the dense step would with that zero-filled gradient, bit for bit (AdamW still
// decays the moments and the weights of the rows without gradient), without building it.
// CPU only: a CUDA parameter's rows are added into a dense gradient first.
EMBER_DECLARE_STUB(adam_rows_step_stub, void (*)(const Tensor& param, const Tensor& row_index,
                                                 const Tensor& row_values, const Tensor& exp_avg,
                                                 const Tensor& exp_avg_sq, const AdamStepArgs& args));
EMBER_DECLARE_STUB(sgd_rows_step_stub, void (*)(const Tensor& param, const Tensor& row_index,
                                                const Tensor& row_values, const Tensor& momentum_buf,
                                                const SgdStepArgs& args));
// sum(|g| * |g|) of that zero-filled [rows, D] gradient, bit for bit as sum() gives it for a
// CPU tensor (the f32 result of an f32 gradient, widened): the squares of the rows alone, added
// in sum()'s order (adding the zeros changes nothing). Values f32 or f64.
EMBER_DECLARE_STUB(rows_sum_of_squares_stub, double (*)(const Tensor& row_index, const Tensor& row_values,
                                                        int64_t rows));

void adam_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
               const AdamStepArgs& args);
// Checks the contract of adam_multi_step_stub (skipping empty parameters) and dispatches.
void adam_multi_step(const std::vector<AdamTensors>& tensors, const AdamStepArgs& args);
void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdStepArgs& args);
void adam_rows_step(const Tensor& param, const Tensor& row_index, const Tensor& row_values, const Tensor& exp_avg,
                    const Tensor& exp_avg_sq, const AdamStepArgs& args);
void sgd_rows_step(const Tensor& param, const Tensor& row_index, const Tensor& row_values, const Tensor& momentum_buf,
                   const SgdStepArgs& args);
double rows_sum_of_squares(const Tensor& row_index, const Tensor& row_values, int64_t rows);

}  // namespace ember::native
