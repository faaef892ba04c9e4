// The 2-D convolution and its two gradients as differentiable ops on checked 4-D arguments
// (core/native/convolution.h; no bias). All three are bilinear and each one's backward is built
// from the three again, so a convolution backward written with them can be differentiated any
// number of times (double backward under create_graph). Under no-grad mode, as in an ordinary
// backward pass, each is its native call and nothing more.
//   conv2d_4d(x, w, y_shape)           y  = conv(x, w), its first y_shape rows and columns
//   conv2d_input_grad(g, w, x_shape)   dx = conv(., w)^T g   (conv_transpose2d's forward)
//   conv2d_weight_grad(g, x, w_shape)  dw = conv(x, .)^T g
#pragma once
#include "core/native/convolution.h"

namespace ember::autograd {

// y_shape: conv's output can have a row or column more than the tensor it is the adjoint of
// (a transposed convolution with output_padding >= stride, allowed below the dilation); the
// kernels then compute only the rows and columns y_shape has.
Tensor conv2d_4d(const Tensor& x, const Tensor& w, const Shape& y_shape, const native::Conv2dParams& p);
Tensor conv2d_input_grad(const Tensor& g, const Tensor& w, const Shape& x_shape, const native::Conv2dParams& p);
Tensor conv2d_weight_grad(const Tensor& g, const Tensor& x, const Shape& w_shape, const native::Conv2dParams& p);

}  // namespace ember::autograd
