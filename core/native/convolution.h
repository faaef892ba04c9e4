// Convolutions without autograd: argument checks, padding resolution, output allocation, then
// three device kernels. Every convolution is a 2-D one on [N, C, H, W] (conv1d runs with a unit
// height), and conv_transpose2d's forward is conv2d's input gradient, so the same three
// kernels serve conv1d, conv2d, conv_transpose2d and all their gradients.
#pragma once
#include <array>

#include "core/conv_padding.h"
#include "core/dispatch.h"
#include "core/tensor.h"

namespace ember::native {

// Geometry of one 2-D convolution, each array {height, width}. Input position of output row oh
// and kernel row kh: oh * stride - padding_begin + kh * dilation; positions outside the input
// read zero. padding_end only decides the output size (it differs from padding_begin for
// "same" with an odd total, the extra at the bottom/right as in PyTorch): a kernel takes the
// sizes from its tensors and needs only padding_begin.
struct Conv2dParams {
  std::array<int64_t, 2> stride{1, 1};
  std::array<int64_t, 2> padding_begin{0, 0};
  std::array<int64_t, 2> padding_end{0, 0};
  std::array<int64_t, 2> dilation{1, 1};
  int64_t groups = 1;
};

// The kernels. All tensors are contiguous and share one dtype and device; input/grad_input
// [N, C, H, W], weight [O, C / groups, kH, kW], output/grad_output [N, O, Ho, Wo], bias [O].
//   conv2d_stub:                 out = conv(input, weight) (+ bias[o] on channel o when defined)
//   conv2d_backward_input_stub:  grad_input = d(conv)/d(input)^T grad_output (+ bias[c] on
//                                channel c when defined: conv_transpose2d's bias; undefined
//                                for a gradient)
//   conv2d_backward_weight_stub: grad_weight = sum over the batch of d(conv)/d(weight)^T grad_output
// Each writes its whole output (no accumulation into what was there).
EMBER_DECLARE_STUB(conv2d_stub, void (*)(const Tensor& out, const Tensor& input, const Tensor& weight,
                                         const Tensor& bias, const Conv2dParams& params));
EMBER_DECLARE_STUB(conv2d_backward_input_stub, void (*)(const Tensor& grad_input, const Tensor& grad_output,
                                                        const Tensor& weight, const Tensor& bias,
                                                        const Conv2dParams& params));
EMBER_DECLARE_STUB(conv2d_backward_weight_stub, void (*)(const Tensor& grad_weight, const Tensor& grad_output,
                                                         const Tensor& input, const Conv2dParams& params));

// A convolution's checked arguments in 2-D form: input [N, C, H, W] and weight [.., .., kH, kW]
// (views of the caller's tensors: a unit batch for unbatched input, a unit height for conv1d),
// the 4-D result's shape, and the shape the result takes once the added dims are dropped again.
struct ConvArgs {
  Tensor input, weight, bias;
  Conv2dParams params;
  Shape output4_shape, output_shape;
};

// Checks for conv1d / conv2d.
ConvArgs conv2d_args(const Tensor& input, const Tensor& weight, const Tensor& bias, const Shape& stride,
                     const ConvPadding& padding, const Shape& dilation, int64_t groups);
ConvArgs conv1d_args(const Tensor& input, const Tensor& weight, const Tensor& bias, int64_t stride,
                     const ConvPadding& padding, int64_t dilation, int64_t groups);
// Checks for conv_transpose2d; params describe the convolution whose input gradient it is.
ConvArgs conv_transpose2d_args(const Tensor& input, const Tensor& weight, const Tensor& bias, const Shape& stride,
                               const Shape& padding, const Shape& output_padding, int64_t groups,
                               const Shape& dilation);

// The 2-D convolution and its two gradients on checked 4-D arguments, each a fresh contiguous
// tensor. conv2d_backward_input's bias is added per channel of the result (see the stub).
Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, const Conv2dParams& params);
Tensor conv2d_backward_input(const Tensor& grad_output, const Tensor& weight, const Tensor& bias,
                             const Shape& input_shape, const Conv2dParams& params);
Tensor conv2d_backward_weight(const Tensor& grad_output, const Tensor& input, const Shape& weight_shape,
                              const Conv2dParams& params);

}  // namespace ember::native
