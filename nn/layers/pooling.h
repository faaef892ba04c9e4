// Pooling layers over the last two dims of [N, C, H, W] or [C, H, W] input, as torch.nn's:
// MaxPool2d, AvgPool2d and AdaptiveAvgPool2d. A one-number size {k} means {k, k}; an empty
// stride means the kernel size. They hold no parameters.
#pragma once
#include "nn/module.h"

namespace ember::nn {

class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(Shape kernel_size, Shape stride = {}, Shape padding = {0}, Shape dilation = {1},
                     bool ceil_mode = false);
  Tensor forward(const Tensor& x) override;
  Shape kernel_size, stride, padding, dilation;
  bool ceil_mode;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(Shape kernel_size, Shape stride = {}, Shape padding = {0}, bool ceil_mode = false,
                     bool count_include_pad = true);
  Tensor forward(const Tensor& x) override;
  Shape kernel_size, stride, padding;
  bool ceil_mode, count_include_pad;
};

class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(Shape output_size);
  Tensor forward(const Tensor& x) override;
  Shape output_size;
};

}  // namespace ember::nn
