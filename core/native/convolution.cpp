#include "core/native/convolution.h"

#include <algorithm>
#include <string>

#include "core/native/copy.h"
#include "core/native/views.h"

namespace ember::native {

EMBER_DEFINE_STUB(conv2d_stub);
EMBER_DEFINE_STUB(conv2d_backward_input_stub);
EMBER_DEFINE_STUB(conv2d_backward_weight_stub);

namespace {

// A per-dim argument given as one value (both dims) or as {h, w}.
std::array<int64_t, 2> pair_of(const char* op, const char* what, const Shape& v) {
  EMBER_CHECK(v.size() == 1 || v.size() == 2, op, ": ", what, " must have 1 or 2 values, got ", v);
  return {v[0], v.back()};
}

void check_tensors(const char* op, const Tensor& input, const Tensor& weight, const Tensor& bias) {
  EMBER_CHECK(input.defined() && weight.defined(), op, ": got an undefined input or weight");
  EMBER_CHECK(is_floating(input.dtype()), op, ": expected a floating-point input, got ", input.dtype());
  EMBER_CHECK(input.dtype() == weight.dtype(), op, ": input and weight must have the same dtype, got ",
              input.dtype(), " (input ", input.shape(), ") and ", weight.dtype(), " (weight ", weight.shape(), ")");
  EMBER_CHECK(input.device() == weight.device(), op, ": input and weight are on different devices (",
              input.device(), " and ", weight.device(), ")");
  if (!bias.defined()) return;
  EMBER_CHECK(bias.dtype() == input.dtype(), op, ": bias must have the input's dtype ", input.dtype(), ", got ",
              bias.dtype());
  EMBER_CHECK(bias.device() == input.device(), op, ": bias is on ", bias.device(), ", input on ", input.device());
}

void check_bias(const char* op, const Tensor& bias, int64_t channels, const Tensor& weight) {
  if (!bias.defined()) return;
  EMBER_CHECK(bias.dim() == 1 && bias.shape()[0] == channels, op, ": bias of shape ", bias.shape(),
              " does not match weight of shape ", weight.shape(), " (expected [", channels, "])");
}

// Ranks, groups and the per-dim arguments shared by every convolution; `spatial` is 1 or 2.
void check_common(const char* op, const Tensor& input, const Tensor& weight, int64_t spatial, int64_t groups,
                  const std::array<int64_t, 2>& stride, const std::array<int64_t, 2>& dilation) {
  const int64_t batched = spatial + 2;
  EMBER_CHECK(input.dim() == batched || input.dim() == batched - 1, op, ": expected a ", batched - 1, "-D (unbatched) or ",
              batched, "-D (batched) input, got shape ", input.shape());
  EMBER_CHECK(weight.dim() == batched, op, ": expected a ", batched, "-D weight, got shape ", weight.shape());
  EMBER_CHECK(groups > 0, op, ": groups must be positive, got ", groups);
  for (int i = 0; i < 2; ++i) {
    EMBER_CHECK(stride[size_t(i)] > 0, op, ": stride must be positive, got ", stride[size_t(i)]);
    EMBER_CHECK(dilation[size_t(i)] > 0, op, ": dilation must be positive, got ", dilation[size_t(i)]);
  }
  for (int64_t d = 0; d < weight.dim(); ++d)
    EMBER_CHECK(weight.shape()[size_t(d)] > 0, op, ": weight of shape ", weight.shape(), " has an empty dim");
}

// The 4-D views: a unit batch for unbatched input, a unit height for 1-D convolutions.
Tensor as_4d(const Tensor& x, int64_t spatial, bool batched) {
  Tensor t = batched ? x : unsqueeze(x, 0);
  return spatial == 1 ? unsqueeze(t, 2) : t;
}

ConvArgs forward_args(const char* op, const Tensor& input, const Tensor& weight, const Tensor& bias, int64_t spatial,
                      const std::array<int64_t, 2>& stride, const std::array<int64_t, 2>& pad_begin,
                      const std::array<int64_t, 2>& pad_end, const std::array<int64_t, 2>& dilation,
                      int64_t groups) {
  check_tensors(op, input, weight, bias);
  check_common(op, input, weight, spatial, groups, stride, dilation);
  for (int i = 0; i < 2; ++i)
    EMBER_CHECK(pad_begin[size_t(i)] >= 0 && pad_end[size_t(i)] >= 0, op, ": padding must be non-negative, got ",
                pad_begin[size_t(i)]);
  const bool batched = input.dim() == spatial + 2;
  const int64_t channels = input.shape()[batched ? 1 : 0], out_channels = weight.shape()[0];
  EMBER_CHECK(channels == weight.shape()[1] * groups, op, ": input of shape ", input.shape(), " has ", channels,
              " channels, but weight of shape ", weight.shape(), " with groups=", groups, " expects ",
              weight.shape()[1] * groups);
  EMBER_CHECK(out_channels % groups == 0, op, ": weight of shape ", weight.shape(), " has ", out_channels,
              " output channels, not divisible by groups=", groups);
  check_bias(op, bias, out_channels, weight);

  ConvArgs a;
  a.input = as_4d(input, spatial, batched);
  a.weight = spatial == 1 ? unsqueeze(weight, 2) : weight;
  a.bias = bias;
  a.params = {stride, pad_begin, pad_end, dilation, groups};
  Shape out4 = {a.input.shape()[0], out_channels};
  for (int i = 0; i < 2; ++i) {
    const int64_t size = a.input.shape()[size_t(2 + i)], k = a.weight.shape()[size_t(2 + i)];
    const int64_t padded = size + pad_begin[size_t(i)] + pad_end[size_t(i)];
    const int64_t span = dilation[size_t(i)] * (k - 1) + 1;
    EMBER_CHECK(span <= padded, op, ": kernel of shape ", weight.shape(), " (dilated extent ", span,
                ") is larger than the padded input (", padded, ") of input shape ", input.shape());
    out4.push_back((padded - span) / stride[size_t(i)] + 1);
  }
  a.output4_shape = out4;
  a.output_shape = out4;
  if (!batched) a.output_shape.erase(a.output_shape.begin());
  if (spatial == 1) a.output_shape.erase(a.output_shape.end() - 2);
  return a;
}

// "same" / "valid" for a 2-D (spatial 2) or 1-D (spatial 1) convolution: per-dim {begin, end}.
std::pair<std::array<int64_t, 2>, std::array<int64_t, 2>> named_padding(const char* op, const std::string& padding,
                                                                         const Tensor& weight, int64_t spatial,
                                                                         const std::array<int64_t, 2>& stride,
                                                                         const std::array<int64_t, 2>& dilation) {
  std::array<int64_t, 2> begin{0, 0}, end{0, 0};
  if (padding == "valid") return {begin, end};
  EMBER_CHECK(padding == "same", op, ": padding must be numbers, \"same\" or \"valid\", got \"", padding, "\"");
  EMBER_CHECK(stride[0] == 1 && stride[1] == 1, op, ": padding=\"same\" needs stride 1, got stride ",
              spatial == 1 ? Shape{stride[1]} : Shape{stride[0], stride[1]});
  EMBER_CHECK(weight.defined() && weight.dim() == spatial + 2, op, ": expected a ", spatial + 2,
              "-D weight, got shape ", weight.defined() ? weight.shape() : Shape{});
  for (int64_t i = 0; i < spatial; ++i) {
    const size_t d = size_t(2 - spatial + i);
    const int64_t total = dilation[d] * (weight.shape()[size_t(2 + i)] - 1);
    begin[d] = total / 2;
    end[d] = total - begin[d];
  }
  return {begin, end};
}

}  // namespace

ConvArgs conv2d_args(const Tensor& input, const Tensor& weight, const Tensor& bias, const Shape& stride,
                     const ConvPadding& padding, const Shape& dilation, int64_t groups) {
  const char* op = "conv2d";
  const auto s = pair_of(op, "stride", stride), d = pair_of(op, "dilation", dilation);
  if (padding.named()) {
    const auto [begin, end] = named_padding(op, padding.mode(), weight, 2, s, d);
    return forward_args(op, input, weight, bias, 2, s, begin, end, d, groups);
  }
  const auto pad = pair_of(op, "padding", padding.values());
  return forward_args(op, input, weight, bias, 2, s, pad, pad, d, groups);
}

ConvArgs conv1d_args(const Tensor& input, const Tensor& weight, const Tensor& bias, int64_t stride,
                     const ConvPadding& padding, int64_t dilation, int64_t groups) {
  const char* op = "conv1d";
  if (padding.named()) {
    const auto [begin, end] = named_padding(op, padding.mode(), weight, 1, {1, stride}, {1, dilation});
    return forward_args(op, input, weight, bias, 1, {1, stride}, begin, end, {1, dilation}, groups);
  }
  EMBER_CHECK(padding.values().size() == 1, op, ": padding must be one number, got ", padding.values());
  const int64_t pad = padding.values()[0];
  return forward_args(op, input, weight, bias, 1, {1, stride}, {0, pad}, {0, pad}, {1, dilation}, groups);
}

ConvArgs conv_transpose2d_args(const Tensor& input, const Tensor& weight, const Tensor& bias, const Shape& stride,
                               const Shape& padding, const Shape& output_padding, int64_t groups,
                               const Shape& dilation) {
  const char* op = "conv_transpose2d";
  const auto s = pair_of(op, "stride", stride), p = pair_of(op, "padding", padding);
  const auto op_pad = pair_of(op, "output_padding", output_padding), d = pair_of(op, "dilation", dilation);
  check_tensors(op, input, weight, bias);
  check_common(op, input, weight, 2, groups, s, d);
  const bool batched = input.dim() == 4;
  const int64_t channels = input.shape()[batched ? 1 : 0];
  EMBER_CHECK(channels == weight.shape()[0], op, ": input of shape ", input.shape(), " has ", channels,
              " channels, but weight of shape ", weight.shape(), " expects ", weight.shape()[0]);
  EMBER_CHECK(channels % groups == 0, op, ": ", channels, " input channels (weight of shape ", weight.shape(),
              ") are not divisible by groups=", groups);
  const int64_t out_channels = weight.shape()[1] * groups;
  check_bias(op, bias, out_channels, weight);

  ConvArgs a;
  a.input = as_4d(input, 2, batched);
  a.weight = weight;
  a.bias = bias;
  a.params = {s, p, p, d, groups};
  Shape out4 = {a.input.shape()[0], out_channels};
  for (size_t i = 0; i < 2; ++i) {
    EMBER_CHECK(p[i] >= 0 && op_pad[i] >= 0, op, ": padding and output_padding must be non-negative, got ", p[i],
                " and ", op_pad[i]);
    EMBER_CHECK(op_pad[i] < s[i] || op_pad[i] < d[i], op, ": output_padding ", output_padding,
                " must be smaller than either stride ", stride, " or dilation ", dilation);
    const int64_t size = (a.input.shape()[2 + i] - 1) * s[i] - 2 * p[i] + d[i] * (weight.shape()[2 + i] - 1) +
                         op_pad[i] + 1;
    EMBER_CHECK(size > 0, op, ": input of shape ", input.shape(), " and weight of shape ", weight.shape(),
                " with padding ", padding, " give a non-positive output size ", size);
    out4.push_back(size);
  }
  a.output4_shape = out4;
  a.output_shape = out4;
  if (!batched) a.output_shape.erase(a.output_shape.begin());
  return a;
}

Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, const Conv2dParams& p) {
  Shape out_shape = {input.shape()[0], weight.shape()[0]};
  for (size_t i = 0; i < 2; ++i) {
    const int64_t span = p.dilation[i] * (weight.shape()[2 + i] - 1) + 1;
    out_shape.push_back((input.shape()[2 + i] + p.padding_begin[i] + p.padding_end[i] - span) / p.stride[i] + 1);
  }
  Tensor out = make_tensor(out_shape, input.dtype(), input.device());
  if (out.numel() == 0) return out;
  conv2d_stub.call(out.device(), "conv2d")(out, contiguous(input), contiguous(weight),
                                           bias.defined() ? contiguous(bias) : Tensor(), p);
  return out;
}

Tensor conv2d_backward_input(const Tensor& grad_output, const Tensor& weight, const Tensor& bias,
                             const Shape& input_shape, const Conv2dParams& p) {
  Tensor grad_input = make_tensor(input_shape, grad_output.dtype(), grad_output.device());
  if (grad_input.numel() == 0) return grad_input;
  conv2d_backward_input_stub.call(grad_input.device(), "conv2d backward (input)")(
      grad_input, contiguous(grad_output), contiguous(weight), bias.defined() ? contiguous(bias) : Tensor(), p);
  return grad_input;
}

Tensor conv2d_backward_weight(const Tensor& grad_output, const Tensor& input, const Shape& weight_shape,
                              const Conv2dParams& p) {
  Tensor grad_weight = make_tensor(weight_shape, grad_output.dtype(), grad_output.device());
  conv2d_backward_weight_stub.call(grad_weight.device(), "conv2d backward (weight)")(
      grad_weight, contiguous(grad_output), contiguous(input), p);
  return grad_weight;
}

}  // namespace ember::native
