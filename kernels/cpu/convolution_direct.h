// A direct f32 forward kernel for convolutions with few taps per output (a first layer on a
// 1-channel image: Cg * kH * kW of 9 or 25). There im2col + GEMM runs a product with a tiny
// inner dimension that spends its time packing and storing rather than multiplying; this
// kernel keeps three output channels by up to 32 output positions in registers, the bias
// seeding them, and sweeps the taps over copies of the image (zero-padded, or shifted per
// kernel column where rows are not a multiple of 8 wide), writing each output once. The
// automatic choice (convolution_path.h) takes it for one-channel layers from kDirectMinTaps
// taps.
#pragma once
#include "core/native/convolution.h"

namespace ember::cpu {

// Taps (Cg * kH * kW) up to which the direct kernel runs.
inline constexpr int64_t kDirectMaxTaps = 32;

// Whether the direct kernel runs this forward convolution: one group, unit strides, at most
// kDirectMaxTaps taps and at least 8 output positions per channel. x [N, C, H, W], w [O, C, kH, kW],
// y [N, O, Ho, Wo].
bool direct_conv_applies(const Shape& x, const Shape& w, const Shape& y, const native::Conv2dParams& params);
// conv2d_stub's contract, f32, where direct_conv_applies.
void direct_conv2d(const Tensor& out, const Tensor& input, const Tensor& weight, const Tensor& bias,
                   const native::Conv2dParams& params);

// Whether the direct weight gradient (convolution_direct_weight.cpp) runs this convolution: where
// direct_conv_applies with at least 16 output positions, on AVX-512 only (its tiles are).
bool direct_weight_grad_applies(const Shape& x, const Shape& w, const Shape& y, const native::Conv2dParams& params);
// conv2d_backward_weight_stub's contract, f32, where direct_weight_grad_applies.
void direct_conv2d_backward_weight(const Tensor& grad_weight, const Tensor& grad_output, const Tensor& input,
                                   const native::Conv2dParams& params);

}  // namespace ember::cpu
