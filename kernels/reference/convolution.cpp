#include "kernels/reference/convolution.h"

namespace ember::reference {

namespace {

RefTensor with_batch(const RefTensor& x, int64_t batched_rank) {
  RefTensor b = x;
  if (x.dim() == batched_rank - 1) b.shape.insert(b.shape.begin(), 1);
  return b;
}

RefTensor without_batch(RefTensor y) {
  y.shape.erase(y.shape.begin());
  return y;
}

// Calls tap(x_flat, w_flat, y_flat) for every multiply-add of the convolution of x [N, C, H, W]
// with w [O, Cg, kH, kW] into y [N, O, Ho, Wo] whose input position lies inside x.
template <typename Tap>
void for_each_tap(const Shape& x, const Shape& w, const Shape& y, const ConvGeometry& g, const Tap& tap) {
  const int64_t cg = w[1], og = w[0] / g.groups;
  for (int64_t n = 0; n < y[0]; ++n)
    for (int64_t o = 0; o < y[1]; ++o)
      for (int64_t oh = 0; oh < y[2]; ++oh)
        for (int64_t ow = 0; ow < y[3]; ++ow)
          for (int64_t c = 0; c < cg; ++c)
            for (int64_t kh = 0; kh < w[2]; ++kh)
              for (int64_t kw = 0; kw < w[3]; ++kw) {
                const int64_t ih = oh * g.stride[0] - g.padding_begin[0] + kh * g.dilation[0];
                const int64_t iw = ow * g.stride[1] - g.padding_begin[1] + kw * g.dilation[1];
                if (ih < 0 || ih >= x[2] || iw < 0 || iw >= x[3]) continue;
                const int64_t ci = (o / og) * cg + c;
                tap(((n * x[1] + ci) * x[2] + ih) * x[3] + iw, ((o * cg + c) * w[2] + kh) * w[3] + kw,
                    ((n * y[1] + o) * y[2] + oh) * y[3] + ow);
              }
}

void add_channel_bias(RefTensor& y, const RefTensor& bias) {
  const int64_t area = y.shape[2] * y.shape[3];
  for (int64_t i = 0; i < y.numel(); ++i) y.data[size_t(i)] += bias.data[size_t((i / area) % y.shape[1])];
}

}  // namespace

RefTensor conv2d(const RefTensor& input, const RefTensor& weight, const RefTensor& bias, bool has_bias,
                 const ConvGeometry& g) {
  const RefTensor x = with_batch(input, 4);
  Shape out_shape = {x.shape[0], weight.shape[0]};
  for (size_t i = 0; i < 2; ++i) {
    const int64_t padded = x.shape[2 + i] + g.padding_begin[i] + g.padding_end[i];
    out_shape.push_back((padded - g.dilation[i] * (weight.shape[2 + i] - 1) - 1) / g.stride[i] + 1);
  }
  RefTensor y(out_shape);
  for_each_tap(x.shape, weight.shape, y.shape, g, [&](int64_t xi, int64_t wi, int64_t yi) {
    y.data[size_t(yi)] += x.data[size_t(xi)] * weight.data[size_t(wi)];
  });
  if (has_bias) add_channel_bias(y, bias);
  return input.dim() == 3 ? without_batch(y) : y;
}

RefTensor conv1d(const RefTensor& input, const RefTensor& weight, const RefTensor& bias, bool has_bias,
                 int64_t stride, int64_t padding_begin, int64_t padding_end, int64_t dilation, int64_t groups) {
  RefTensor x = input, w = weight;
  x.shape.insert(x.shape.end() - 1, 1);
  w.shape.insert(w.shape.end() - 1, 1);
  RefTensor y = conv2d(x, w, bias, has_bias, {{1, stride}, {0, padding_begin}, {0, padding_end}, {1, dilation}, groups});
  y.shape.erase(y.shape.end() - 2);
  return y;
}

RefTensor conv_transpose2d(const RefTensor& input, const RefTensor& weight, const RefTensor& bias, bool has_bias,
                           const Shape& stride, const Shape& padding, const Shape& output_padding, int64_t groups,
                           const Shape& dilation) {
  const RefTensor x = with_batch(input, 4);
  const int64_t cin_g = weight.shape[0] / groups, cout_g = weight.shape[1];
  Shape out_shape = {x.shape[0], cout_g * groups};
  for (size_t i = 0; i < 2; ++i)
    out_shape.push_back((x.shape[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (weight.shape[2 + i] - 1) +
                        output_padding[i] + 1);
  RefTensor y(out_shape);
  for (int64_t n = 0; n < x.shape[0]; ++n)
    for (int64_t ci = 0; ci < x.shape[1]; ++ci)
      for (int64_t ih = 0; ih < x.shape[2]; ++ih)
        for (int64_t iw = 0; iw < x.shape[3]; ++iw)
          for (int64_t c = 0; c < cout_g; ++c)
            for (int64_t kh = 0; kh < weight.shape[2]; ++kh)
              for (int64_t kw = 0; kw < weight.shape[3]; ++kw) {
                const int64_t oh = ih * stride[0] - padding[0] + kh * dilation[0];
                const int64_t ow = iw * stride[1] - padding[1] + kw * dilation[1];
                if (oh < 0 || oh >= out_shape[2] || ow < 0 || ow >= out_shape[3]) continue;
                const int64_t co = (ci / cin_g) * cout_g + c;
                y.at({n, co, oh, ow}) += x.at({n, ci, ih, iw}) * weight.at({ci, c, kh, kw});
              }
  if (has_bias) add_channel_bias(y, bias);
  return input.dim() == 3 ? without_batch(y) : y;
}

ConvGradients conv2d_backward(const RefTensor& input, const RefTensor& weight, const RefTensor& grad_output,
                              const ConvGeometry& g) {
  ConvGradients d{RefTensor(input.shape), RefTensor(weight.shape), RefTensor({weight.shape[0]})};
  for_each_tap(input.shape, weight.shape, grad_output.shape, g, [&](int64_t xi, int64_t wi, int64_t yi) {
    d.input.data[size_t(xi)] += grad_output.data[size_t(yi)] * weight.data[size_t(wi)];
    d.weight.data[size_t(wi)] += grad_output.data[size_t(yi)] * input.data[size_t(xi)];
  });
  const int64_t area = grad_output.shape[2] * grad_output.shape[3];
  for (int64_t i = 0; i < grad_output.numel(); ++i)
    d.bias.data[size_t((i / area) % grad_output.shape[1])] += grad_output.data[size_t(i)];
  return d;
}

}  // namespace ember::reference
