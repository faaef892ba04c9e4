// f32 convolution passes on oneDNN's convolution primitive, for NCHW tensors: operands are
// reordered into the primitive's preferred (blocked) layouts in per-thread scratch, and the
// result back into the caller's NCHW tensor. Primitives are created once per shape and cached.
// Contract of the stubs in core/native/convolution.h; the caller has checked that
// conv_path_for (convolution_path.h) chose this path. The batch is split over Ember's pool,
// each thread running the primitive on its images with one OpenMP thread (the weight
// gradient's per-thread partial sums are then added in a fixed order).
#pragma once
#include "core/native/convolution.h"
#include "kernels/cpu/convolution_path.h"

namespace ember::cpu {

// Whether oneDNN's primitive takes the pass: one group, no input-gradient bias
// (conv_transpose2d's), a non-empty batch, non-negative end padding, and not a 1x1 stride-1
// unpadded convolution (its GEMM needs no im2col). x, w and y are the forward's shapes.
bool onednn_conv_supports(ConvPass pass, const Shape& x, const Shape& w, const Shape& y,
                          const native::Conv2dParams& params, bool has_bias);

void onednn_conv2d(const Tensor& out, const Tensor& input, const Tensor& weight, const Tensor& bias,
                   const native::Conv2dParams& params);
void onednn_conv2d_backward_input(const Tensor& grad_input, const Tensor& grad_output, const Tensor& weight,
                                  const native::Conv2dParams& params);
void onednn_conv2d_backward_weight(const Tensor& grad_weight, const Tensor& grad_output, const Tensor& input,
                                   const native::Conv2dParams& params);

}  // namespace ember::cpu
