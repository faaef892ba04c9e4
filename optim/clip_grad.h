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
void clip_grad_value_(const std::vector<Tensor>& params, double clip_value);

}  // namespace ember::optim
