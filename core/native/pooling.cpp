#include "core/native/pooling.h"

#include "core/factory.h"
#include "core/native/copy.h"
#include "core/native/views.h"

namespace ember::native {

EMBER_DEFINE_STUB(max_pool2d_stub);
EMBER_DEFINE_STUB(max_pool2d_backward_stub);
EMBER_DEFINE_STUB(avg_pool2d_stub);
EMBER_DEFINE_STUB(avg_pool2d_backward_stub);

namespace {

// Input [N, C, H, W] or [C, H, W] of a floating dtype with non-empty C, H and W (N may be 0).
void check_pool_input(const Tensor& x, const char* op) {
  EMBER_CHECK(x.dim() == 3 || x.dim() == 4, op, ": expected a 3-D [C, H, W] or 4-D [N, C, H, W] input, got shape ",
              x.shape());
  EMBER_CHECK(is_floating(x.dtype()), op, ": expected a floating-point tensor, got ", dtype_name(x.dtype()),
              " of shape ", x.shape());
  for (int64_t d = x.dim() - 3; d < x.dim(); ++d)
    EMBER_CHECK(x.size(d) > 0, op, ": input of shape ", x.shape(), " has an empty dim ", d,
                " (only the batch dim may be 0)");
}

// {k} -> {k, k}; {a, b} stays; anything else is an error naming the option.
Shape pair_of(const Shape& v, const char* name, const Tensor& x, const char* op) {
  EMBER_CHECK(v.size() == 1 || v.size() == 2, op, ": ", name, " must have 1 or 2 values, got ", v, " (input of shape ",
              x.shape(), ")");
  return v.size() == 1 ? Shape{v[0], v[0]} : v;
}

int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0)) ? 1 : 0); }

// PyTorch's rule: floor (or ceil) of the window count, and in ceil mode the last window must
// start inside the input or its left padding.
int64_t pooled_size(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
  int64_t out = floor_div(in + 2 * p - d * (k - 1) - 1 + (ceil_mode ? s - 1 : 0), s) + 1;
  if (ceil_mode && (out - 1) * s >= in + p) --out;
  return out;
}

Shape pooled_shape(const Tensor& x, int64_t out_h, int64_t out_w) {
  Shape s = x.shape();
  s[s.size() - 2] = out_h;
  s[s.size() - 1] = out_w;
  return s;
}

// The input as contiguous planes [N * C, H, W].
Tensor as_planes(const Tensor& x, const Pool2dGeometry& g) {
  return contiguous(reshape(x, {g.planes, g.in_h, g.in_w}));
}

}  // namespace

Pool2dGeometry pool2d_geometry(const Tensor& x, const Pool2dOptions& o, const char* op) {
  check_pool_input(x, op);
  const Shape k = pair_of(o.kernel_size, "kernel_size", x, op);
  const Shape s = o.stride.empty() ? k : pair_of(o.stride, "stride", x, op);
  const Shape p = pair_of(o.padding, "padding", x, op);
  const Shape d = pair_of(o.dilation, "dilation", x, op);
  EMBER_CHECK(k[0] > 0 && k[1] > 0, op, ": kernel_size must be positive, got ", k, " (input of shape ", x.shape(), ")");
  EMBER_CHECK(s[0] > 0 && s[1] > 0, op, ": stride must be positive, got ", s, " (input of shape ", x.shape(), ")");
  EMBER_CHECK(d[0] > 0 && d[1] > 0, op, ": dilation must be positive, got ", d, " (input of shape ", x.shape(), ")");
  EMBER_CHECK(p[0] >= 0 && p[1] >= 0 && p[0] <= k[0] / 2 && p[1] <= k[1] / 2, op, ": padding ", p,
              " must be non-negative and at most half the kernel_size ", k, " (input of shape ", x.shape(), ")");
  Pool2dGeometry g;
  g.in_h = x.size(-2);
  g.in_w = x.size(-1);
  g.planes = x.numel() / (g.in_h * g.in_w);
  g.kernel_h = k[0], g.kernel_w = k[1], g.stride_h = s[0], g.stride_w = s[1];
  g.pad_h = p[0], g.pad_w = p[1], g.dilation_h = d[0], g.dilation_w = d[1];
  g.count_include_pad = o.count_include_pad;
  g.out_h = pooled_size(g.in_h, k[0], s[0], p[0], d[0], o.ceil_mode);
  g.out_w = pooled_size(g.in_w, k[1], s[1], p[1], d[1], o.ceil_mode);
  EMBER_CHECK(g.out_h >= 1 && g.out_w >= 1, op, ": input of shape ", x.shape(), " is too small for kernel_size ", k,
              ", stride ", s, ", padding ", p, " and dilation ", d, ": the output would be ", g.out_h, "x", g.out_w);
  return g;
}

Pool2dGeometry adaptive_pool2d_geometry(const Tensor& x, const Shape& output_size, const char* op) {
  check_pool_input(x, op);
  const Shape o = pair_of(output_size, "output_size", x, op);
  EMBER_CHECK(o[0] >= 1 && o[1] >= 1, op, ": output_size must be positive, got ", o, " (input of shape ", x.shape(),
              ")");
  Pool2dGeometry g;
  g.in_h = x.size(-2);
  g.in_w = x.size(-1);
  g.planes = x.numel() / (g.in_h * g.in_w);
  g.out_h = o[0];
  g.out_w = o[1];
  g.adaptive = true;
  return g;
}

MaxPool2dResult max_pool2d(const Tensor& x, const Pool2dGeometry& g) {
  const Shape shape = pooled_shape(x, g.out_h, g.out_w);
  MaxPool2dResult r{make_tensor(shape, x.dtype(), x.device()), make_tensor(shape, DType::i64, x.device())};
  if (g.planes == 0) return r;
  max_pool2d_stub.call(x.device(), "max_pool2d")(r.out, r.indices, as_planes(x, g), g);
  return r;
}

Tensor max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, const Shape& input_shape,
                           const Pool2dGeometry& g) {
  EMBER_CHECK(grad_out.shape() == indices.shape(), "max_pool2d_backward: gradient of shape ", grad_out.shape(),
              " does not match indices of shape ", indices.shape());
  Tensor grad_in = make_tensor(input_shape, grad_out.dtype(), grad_out.device());
  if (g.planes == 0) return grad_in;
  max_pool2d_backward_stub.call(grad_out.device(), "max_pool2d_backward")(
      grad_in, contiguous(reshape(grad_out, {g.planes, g.out_h, g.out_w})), contiguous(indices), g);
  return grad_in;
}

Tensor avg_pool2d(const Tensor& x, const Pool2dGeometry& g) {
  Tensor out = make_tensor(pooled_shape(x, g.out_h, g.out_w), x.dtype(), x.device());
  if (g.planes == 0) return out;
  avg_pool2d_stub.call(x.device(), g.adaptive ? "adaptive_avg_pool2d" : "avg_pool2d")(out, as_planes(x, g), g);
  return out;
}

Tensor avg_pool2d_backward(const Tensor& grad_out, const Shape& input_shape, const Pool2dGeometry& g) {
  const Shape want = {g.planes, g.out_h, g.out_w};
  EMBER_CHECK(grad_out.numel() == numel_of(want), "avg_pool2d_backward: gradient of shape ", grad_out.shape(),
              " does not match the pooled output ", want);
  Tensor grad_in = make_tensor(input_shape, grad_out.dtype(), grad_out.device());
  if (g.planes == 0) return grad_in;
  avg_pool2d_backward_stub.call(grad_out.device(), g.adaptive ? "adaptive_avg_pool2d_backward" : "avg_pool2d_backward")(
      grad_in, contiguous(reshape(grad_out, want)), g);
  return grad_in;
}

}  // namespace ember::native
