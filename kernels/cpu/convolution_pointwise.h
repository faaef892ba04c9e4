// The f32 forward pass of a 1x1 convolution that im2col would have to gather (a stride or
// padding): y[n] [O, Ho*Wo] = W [O, C] @ x[n] gathered to [C, Ho*Wo], with the gathered operand
// written straight into the packed GEMM's 16-column panels (gemm_packed.h) and multiplied there
// by its AVX2 micro-kernel. The im2col path writes the gathered columns once and the GEMM packs
// them again; on a stride-2 1x1 layer those two copies cost a third of the multiply. The
// weight gradient (convolution_pointwise_weight.cpp) gathers each image into rows of positions
// and takes dot products along them. Part of the GEMM path (convolution.cpp calls it for f32
// where it applies).
#pragma once
#include "core/native/convolution.h"

namespace ember::cpu {

// Input channels up to which one panel of the gathered operand covers them all (the packed
// GEMM's inner-dimension block).
inline constexpr int64_t kPointwiseMaxChannels = 256;

// A 1x1 convolution with one group, at most kPointwiseMaxChannels input channels, a stride or
// padding other than 0 (without either it needs no gather) and a non-empty result.
bool pointwise_conv_applies(const Shape& x, const Shape& w, const Shape& y, const native::Conv2dParams& params);
// conv2d_stub's contract, f32, where pointwise_conv_applies.
void pointwise_conv2d(const Tensor& out, const Tensor& input, const Tensor& weight, const Tensor& bias,
                      const native::Conv2dParams& params);
// conv2d_backward_weight_stub's contract, f32, where pointwise_conv_applies: the gathered
// input's rows against dY's, dot products along the output positions.
void pointwise_conv2d_backward_weight(const Tensor& grad_weight, const Tensor& grad_output, const Tensor& input,
                                      const native::Conv2dParams& params);

}  // namespace ember::cpu
