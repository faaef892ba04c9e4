// Gradient clipping, as torch.nn.utils.clip_grad_norm_ / clip_grad_value_.
#pragma once
#include <vector>

#include "core/tensor.h"

namespace ember::optim {

// Scales all gradients so their joint norm is at most max_norm; returns the norm before
// clipping. norm_type 2 or infinity. A non-finite norm raises ember::Error when
// error_if_nonfinite, otherwise gradients are left as they are and the norm returned.
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);
// The pieces clip_grad_norm_ is made of, for gradients spread over ranks (sharded data
// parallel): accumulate_grad_norm gives sum |g|^p over `grads` (the max |g| for the inf norm),
// partials that add (or max) across ranks; finish_grad_norm turns the combined partial into the
// norm; scale_grads_to_norm multiplies every gradient by max_norm / (total_norm + 1e-6) when
// that is below 1.
double accumulate_grad_norm(const std::vector<Tensor>& grads, double norm_type);
double finish_grad_norm(double accumulated, double norm_type);
void scale_grads_to_norm(const std::vector<Tensor>& grads, double max_norm, double total_norm,
                         bool error_if_nonfinite);

void clip_grad_value_(const std::vector<Tensor>& params, double clip_value);

}  // namespace ember::optim
