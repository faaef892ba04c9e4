// f32 convolution passes on oneDNN's convolution primitive, for NCHW tensors: operands are
// reordered into the primitive's preferred (blocked) layouts in per-thread scratch, and the
// result back into the caller's NCHW tensor. Primitives are created once per shape and cached.
// Contract of the stubs in core/native/convolution.h; the caller has checked that
// conv_path_for (convolution_path.h) chose this path. The batch is split over Ember's pool,
// each thread running the primitive on its images with one OpenMP thread.
#pragma once
#include "core/native/convolution.h"

namespace ember::cpu {

void onednn_conv2d(const Tensor& out, const Tensor& input, const Tensor& weight, const Tensor& bias,
                   const native::Conv2dParams& params);
void onednn_conv2d_backward_input(const Tensor& grad_input, const Tensor& grad_output, const Tensor& weight,
                                  const native::Conv2dParams& params);

}  // namespace ember::cpu
