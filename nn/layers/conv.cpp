#include "nn/layers/conv.h"

#include <cmath>

#include "core/factory.h"
#include "core/ops.h"
#include "nn/init.h"

namespace ember::nn {

ConvNd::ConvNd(const char* type_name, ConvOptions opt, int64_t spatial, bool transposed)
    : Module(type_name), options(std::move(opt)), spatial_(spatial) {
  const ConvOptions& o = options;
  EMBER_CHECK(o.in_channels > 0 && o.out_channels > 0, type_name, ": channels must be positive, got in_channels=",
              o.in_channels, " out_channels=", o.out_channels);
  EMBER_CHECK(o.groups > 0 && o.in_channels % o.groups == 0 && o.out_channels % o.groups == 0, type_name,
              ": in_channels=", o.in_channels, " and out_channels=", o.out_channels,
              " must both be divisible by groups=", o.groups);
  EMBER_CHECK(!o.padding.named() || !transposed, type_name, ": padding must be numbers, got \"",
              o.padding.mode(), "\"");
  Shape shape = transposed ? Shape{o.in_channels, o.out_channels / o.groups}
                           : Shape{o.out_channels, o.in_channels / o.groups};
  for (int64_t k : per_dim(o.kernel_size)) {
    EMBER_CHECK(k > 0, type_name, ": kernel_size must be positive, got ", o.kernel_size);
    shape.push_back(k);
  }
  weight = register_parameter("weight", empty(shape, {o.dtype}));
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (o.bias) {
    bias = register_parameter("bias", empty({o.out_channels}, {o.dtype}));
    const double bound = 1.0 / std::sqrt(double(init::fans(weight).first));
    init::uniform_(bias, -bound, bound);
  }
}

Shape ConvNd::per_dim(const Shape& v) const {
  EMBER_CHECK(v.size() == 1 || int64_t(v.size()) == spatial_, type_name(), ": expected 1 or ", spatial_,
              " values, got ", v);
  return v.size() == 1 ? Shape(size_t(spatial_), v[0]) : v;
}

Conv1d::Conv1d(ConvOptions opt) : ConvNd("Conv1d", std::move(opt), 1, false) {}

Tensor Conv1d::forward(const Tensor& x) {
  auto scope = enter_forward();
  const ConvOptions& o = options;
  const ConvPadding padding = o.padding.named() ? o.padding : ConvPadding(per_dim(o.padding.values()));
  return scope.exit(conv1d(x, weight, bias, per_dim(o.stride)[0], padding, per_dim(o.dilation)[0], o.groups));
}

Conv2d::Conv2d(ConvOptions opt) : ConvNd("Conv2d", std::move(opt), 2, false) {}

Tensor Conv2d::forward(const Tensor& x) {
  auto scope = enter_forward();
  const ConvOptions& o = options;
  const ConvPadding padding = o.padding.named() ? o.padding : ConvPadding(per_dim(o.padding.values()));
  return scope.exit(conv2d(x, weight, bias, per_dim(o.stride), padding, per_dim(o.dilation), o.groups));
}

ConvTranspose2d::ConvTranspose2d(ConvOptions opt) : ConvNd("ConvTranspose2d", std::move(opt), 2, true) {}

Tensor ConvTranspose2d::forward(const Tensor& x) {
  auto scope = enter_forward();
  const ConvOptions& o = options;
  return scope.exit(conv_transpose2d(x, weight, bias, per_dim(o.stride), per_dim(o.padding.values()),
                                     per_dim(o.output_padding), o.groups, per_dim(o.dilation)));
}

}  // namespace ember::nn
