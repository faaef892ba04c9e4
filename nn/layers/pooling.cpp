#include "nn/layers/pooling.h"

#include <utility>

namespace ember::nn {

MaxPool2d::MaxPool2d(Shape kernel_size_, Shape stride_, Shape padding_, Shape dilation_, bool ceil_mode_)
    : Module("MaxPool2d"),
      kernel_size(std::move(kernel_size_)),
      stride(std::move(stride_)),
      padding(std::move(padding_)),
      dilation(std::move(dilation_)),
      ceil_mode(ceil_mode_) {}

Tensor MaxPool2d::forward(const Tensor& x) {
  auto scope = enter_forward();
  return scope.exit(max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode));
}

AvgPool2d::AvgPool2d(Shape kernel_size_, Shape stride_, Shape padding_, bool ceil_mode_, bool count_include_pad_)
    : Module("AvgPool2d"),
      kernel_size(std::move(kernel_size_)),
      stride(std::move(stride_)),
      padding(std::move(padding_)),
      ceil_mode(ceil_mode_),
      count_include_pad(count_include_pad_) {}

Tensor AvgPool2d::forward(const Tensor& x) {
  auto scope = enter_forward();
  return scope.exit(avg_pool2d(x, kernel_size, stride, padding, ceil_mode, count_include_pad));
}

AdaptiveAvgPool2d::AdaptiveAvgPool2d(Shape output_size_)
    : Module("AdaptiveAvgPool2d"), output_size(std::move(output_size_)) {}

Tensor AdaptiveAvgPool2d::forward(const Tensor& x) {
  auto scope = enter_forward();
  return scope.exit(adaptive_avg_pool2d(x, output_size));
}

}  // namespace ember::nn
