// 2-D max and average pooling without autograd: argument checks, output sizes, output
// allocation and the dispatch to the device kernels. autograd/functions/pooling.cpp adds the
// backward. Kernels see the input as planes [N * C, H, W], contiguous.
#pragma once
#include <cstdint>

#include "core/dispatch.h"
#include "core/tensor.h"

namespace ember::native {

// One pooling problem in both dims. Window o of a dim starts at o * stride - padding and
// reaches kernel positions start + k * dilation, k < kernel. With `adaptive` the windows are
// instead [floor(o * in / out), ceil((o + 1) * in / out)) and kernel, stride, padding and
// dilation are unused.
struct Pool2dGeometry {
  int64_t planes = 0;  // N * C
  int64_t in_h = 0, in_w = 0, out_h = 0, out_w = 0;
  int64_t kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0, dilation_h = 1, dilation_w = 1;
  bool adaptive = false;
  // Average pooling divides by the window clipped to the padded input (true) or to the input.
  bool count_include_pad = true;
};

// out [planes, out_h, out_w] = the maximum of each window of x [planes, in_h, in_w]; indices
// (i64, out's shape) = its position ih * in_w + iw in the plane: the first maximum in row-major
// window order, or the last NaN when the window holds one (NaN is the maximum).
EMBER_DECLARE_STUB(max_pool2d_stub,
                   void (*)(const Tensor& out, const Tensor& indices, const Tensor& x, const Pool2dGeometry& g));
// grad_in [planes, in_h, in_w] (written whole) = the sum of grad_out at the outputs whose index
// names each position.
EMBER_DECLARE_STUB(max_pool2d_backward_stub, void (*)(const Tensor& grad_in, const Tensor& grad_out,
                                                      const Tensor& indices, const Pool2dGeometry& g));
// out = the mean of each window of x (average or adaptive average pooling, as g says).
EMBER_DECLARE_STUB(avg_pool2d_stub, void (*)(const Tensor& out, const Tensor& x, const Pool2dGeometry& g));
// grad_in (written whole) = the sum over windows holding each position of grad_out / divisor.
EMBER_DECLARE_STUB(avg_pool2d_backward_stub,
                   void (*)(const Tensor& grad_in, const Tensor& grad_out, const Pool2dGeometry& g));

// The options of max_pool2d and avg_pool2d, as the user gave them ({k} means {k, k}; an empty
// stride means the kernel size).
struct Pool2dOptions {
  Shape kernel_size;
  Shape stride;
  Shape padding{0, 0};
  Shape dilation{1, 1};
  bool ceil_mode = false;
  bool count_include_pad = true;
};

// Checks the input and options of `op` and returns the geometry; throws ember::Error naming the
// op, the input shape and the offending option.
Pool2dGeometry pool2d_geometry(const Tensor& x, const Pool2dOptions& o, const char* op);
Pool2dGeometry adaptive_pool2d_geometry(const Tensor& x, const Shape& output_size, const char* op);

struct MaxPool2dResult {
  Tensor out;
  Tensor indices;  // i64, out's shape: the argmax of each window within its plane
};
MaxPool2dResult max_pool2d(const Tensor& x, const Pool2dGeometry& g);
// The gradient for x (of shape input_shape) from grad_out and the forward's indices.
Tensor max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Shape& input_shape,
                           const Pool2dGeometry& g);
Tensor avg_pool2d(const Tensor& x, const Pool2dGeometry& g);
Tensor avg_pool2d_backward(const Tensor& grad_out, const Shape& input_shape, const Pool2dGeometry& g);

}  // namespace ember::native
