// Reference convolutions: every tap of the kernel visited by plain loops in double precision.
#pragma once
#include "kernels/reference/ref_tensor.h"

namespace ember::reference {

// Geometry of a 2-D convolution, each pair {height, width}. Input row of output row oh and
// kernel row kh: oh * stride - padding_begin + kh * dilation (outside the input: zero).
struct ConvGeometry {
  Shape stride{1, 1}, padding_begin{0, 0}, padding_end{0, 0}, dilation{1, 1};
  int64_t groups = 1;
};

// input [N, C, H, W] or [C, H, W], weight [O, C / groups, kH, kW], bias [O] when has_bias.
RefTensor conv2d(const RefTensor& input, const RefTensor& weight, const RefTensor& bias, bool has_bias,
                 const ConvGeometry& geometry);
// input [N, C, L] or [C, L], weight [O, C / groups, K]: conv2d on a unit height.
RefTensor conv1d(const RefTensor& input, const RefTensor& weight, const RefTensor& bias, bool has_bias,
                 int64_t stride, int64_t padding_begin, int64_t padding_end, int64_t dilation, int64_t groups);
// input [N, Cin, H, W] or [Cin, H, W], weight [Cin, Cout / groups, kH, kW]: each input element
// scattered through the kernel into the output.
RefTensor conv_transpose2d(const RefTensor& input, const RefTensor& weight, const RefTensor& bias, bool has_bias,
                           const Shape& stride, const Shape& padding, const Shape& output_padding, int64_t groups,
                           const Shape& dilation);

// The gradients of conv2d (4-D input) for grad_output, from the same loops as the forward.
struct ConvGradients {
  RefTensor input, weight, bias;
};
ConvGradients conv2d_backward(const RefTensor& input, const RefTensor& weight, const RefTensor& grad_output,
                              const ConvGeometry& geometry);

}  // namespace ember::reference
