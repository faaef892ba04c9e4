// Reference 2-D max and average pooling, written from their definitions: each output visits
// its window position by position. Inputs are [N, C, H, W] or [C, H, W]; a one-number option
// {k} means {k, k}.
#pragma once
#include "kernels/reference/ref_tensor.h"

namespace ember::reference {

struct PoolOptions {
  Shape kernel_size;
  Shape stride;  // empty: the kernel size
  Shape padding{0, 0};
  Shape dilation{1, 1};
  bool ceil_mode = false;
  bool count_include_pad = true;
};

// The maximum of each window (NaN wins; ties keep the first in row-major window order).
RefTensor max_pool2d(const RefTensor& x, const PoolOptions& o);
// Each output's gradient added at its window's argmax (chosen as in max_pool2d).
RefTensor max_pool2d_backward(const RefTensor& x, const RefTensor& grad_out, const PoolOptions& o);
RefTensor avg_pool2d(const RefTensor& x, const PoolOptions& o);
RefTensor avg_pool2d_backward(const RefTensor& x, const RefTensor& grad_out, const PoolOptions& o);
// Output cell i of a dim of size n -> m averages input [floor(i n / m), ceil((i + 1) n / m)).
RefTensor adaptive_avg_pool2d(const RefTensor& x, const Shape& output_size);
RefTensor adaptive_avg_pool2d_backward(const RefTensor& x, const RefTensor& grad_out, const Shape& output_size);

}  // namespace ember::reference
