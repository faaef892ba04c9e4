// Loss-scaling support for mixed precision (optim::GradScaler): one pass over a gradient that
// unscales it in place and notes whether any value is not finite.
#pragma once
#include "core/dispatch.h"
#include "core/tensor.h"

namespace ember::native {

// grad *= inv_scale, in place, computed in acc_t of grad's dtype. When any result is inf or
// NaN (a non-finite gradient, or one that overflows on unscaling) found_inf[0] is set to 1;
// it is never cleared, so one flag collects the verdict over many gradients. grad: f32, f64,
// f16 or bf16, any strides without overlap; found_inf: f32 of shape [1] on grad's device.
EMBER_DECLARE_STUB(amp_unscale_stub, void (*)(const Tensor& grad, const Tensor& found_inf, double inv_scale));

void amp_unscale_(const Tensor& grad, const Tensor& found_inf, double inv_scale);

}  // namespace ember::native
