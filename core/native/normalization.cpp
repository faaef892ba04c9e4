#include "core/native/normalization.h"

#include "core/native/copy.h"

namespace ember::native {

EMBER_DEFINE_STUB(softmax_stub);
EMBER_DEFINE_STUB(softmax_backward_stub);
EMBER_DEFINE_STUB(layer_norm_stub);
EMBER_DEFINE_STUB(layer_norm_backward_stub);

namespace {

SoftmaxGeometry softmax_geometry(const Shape& shape, int64_t dim, const char* op) {
  const int64_t nd = int64_t(shape.size());
  const int64_t lo = nd > 0 ? -nd : -1, hi = nd > 0 ? nd - 1 : 0;
  EMBER_CHECK(dim >= lo && dim <= hi, op, ": dim ", dim, " out of range for a tensor of shape ", shape,
              " (expected ", lo, " to ", hi, ")");
  SoftmaxGeometry g;
  if (nd == 0) return g;
  const int64_t d = dim < 0 ? dim + nd : dim;
  for (int64_t k = 0; k < nd; ++k) {
    if (k < d) g.outer *= shape[size_t(k)];
    else if (k == d) g.len = shape[size_t(k)];
    else g.inner *= shape[size_t(k)];
  }
  return g;
}

Tensor softmax_forward(const Tensor& x, int64_t dim, bool log, const char* op) {
  EMBER_CHECK(is_floating(x.dtype()), op, ": expected a floating-point tensor, got ", dtype_name(x.dtype()),
              " of shape ", x.shape());
  const SoftmaxGeometry g = softmax_geometry(x.shape(), dim, op);
  Tensor out = make_tensor(x.shape(), x.dtype(), x.device());
  if (out.numel() == 0) return out;
  softmax_stub.call(x.device(), op)(out, contiguous(x), g, log);
  return out;
}

Tensor softmax_grad(const Tensor& grad, const Tensor& y, int64_t dim, bool log, const char* op) {
  EMBER_CHECK(grad.shape() == y.shape(), op, ": gradient of shape ", grad.shape(),
              " does not match the output of shape ", y.shape());
  const SoftmaxGeometry g = softmax_geometry(y.shape(), dim, op);
  Tensor out = make_tensor(y.shape(), y.dtype(), y.device());
  if (out.numel() == 0) return out;
  softmax_backward_stub.call(y.device(), op)(out, contiguous(to_dtype(grad, y.dtype())), contiguous(y), g, log);
  return out;
}

DType stats_dtype(DType x) { return x == DType::f64 ? DType::f64 : DType::f32; }

// Checks weight or bias against normalized_shape; returns it contiguous in `dtype` (or undefined).
Tensor affine_param(const Tensor& p, const char* what, const Tensor& x, const Shape& normalized_shape, DType dtype) {
  if (!p.defined()) return p;
  EMBER_CHECK(p.shape() == normalized_shape, "layer_norm: ", what, " of shape ", p.shape(),
              " does not match normalized_shape ", normalized_shape, " (input of shape ", x.shape(), ")");
  EMBER_CHECK(is_floating(p.dtype()), "layer_norm: ", what, " must be floating point, got ", dtype_name(p.dtype()));
  EMBER_CHECK(p.device() == x.device(), "layer_norm: ", what, " is on ", p.device(), " but the input is on ",
              x.device());
  return contiguous(to_dtype(p, dtype));
}

// Rows and columns of x viewed as [rows, prod(normalized_shape)], after checking the shapes.
std::pair<int64_t, int64_t> layer_norm_rows_cols(const Tensor& x, const Shape& normalized_shape) {
  const int64_t k = int64_t(normalized_shape.size());
  EMBER_CHECK(k >= 1, "layer_norm: normalized_shape must have at least one dim (input of shape ", x.shape(), ")");
  bool matches = x.dim() >= k;
  for (int64_t i = 0; matches && i < k; ++i)
    matches = x.shape()[size_t(x.dim() - k + i)] == normalized_shape[size_t(i)];
  EMBER_CHECK(matches, "layer_norm: normalized_shape ", normalized_shape,
              " does not match the trailing dims of the input of shape ", x.shape());
  const int64_t cols = numel_of(normalized_shape);
  return {cols == 0 ? 0 : x.numel() / cols, cols};
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_forward(x, dim, false, "softmax"); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return softmax_forward(x, dim, true, "log_softmax"); }
Tensor softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim) {
  return softmax_grad(grad, y, dim, false, "softmax_backward");
}
Tensor log_softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim) {
  return softmax_grad(grad, y, dim, true, "log_softmax_backward");
}

LayerNormResult layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                           const Tensor& bias, double eps) {
  EMBER_CHECK(is_floating(x.dtype()), "layer_norm: expected a floating-point input, got ", dtype_name(x.dtype()),
              " of shape ", x.shape());
  EMBER_CHECK(eps >= 0, "layer_norm: eps must be non-negative, got ", eps);
  const auto [rows, cols] = layer_norm_rows_cols(x, normalized_shape);
  const DType sd = stats_dtype(x.dtype());
  Tensor w = affine_param(weight, "weight", x, normalized_shape, sd);
  Tensor b = affine_param(bias, "bias", x, normalized_shape, sd);
  LayerNormResult r{make_tensor(x.shape(), x.dtype(), x.device()), make_tensor({rows}, sd, x.device()),
                    make_tensor({rows}, sd, x.device())};
  if (x.numel() == 0) return r;
  layer_norm_stub.call(x.device(), "layer_norm")(r.y, r.mean, r.rstd, contiguous(x), w, b, rows, cols, eps);
  return r;
}

LayerNormGrads layer_norm_backward(const Tensor& grad, const Tensor& x, const Shape& normalized_shape,
                                   const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                                   const Tensor& bias, bool need_dx, bool need_dweight, bool need_dbias) {
  EMBER_CHECK(grad.shape() == x.shape(), "layer_norm_backward: gradient of shape ", grad.shape(),
              " does not match the input of shape ", x.shape());
  const auto [rows, cols] = layer_norm_rows_cols(x, normalized_shape);
  const DType sd = stats_dtype(x.dtype());
  Tensor w = affine_param(weight, "weight", x, normalized_shape, sd);
  LayerNormGrads out;
  if (need_dx) out.dx = make_tensor(x.shape(), x.dtype(), x.device());
  if (need_dweight && weight.defined()) out.dweight = make_tensor(normalized_shape, sd, x.device());
  if (need_dbias && bias.defined()) out.dbias = make_tensor(normalized_shape, sd, x.device());
  if (rows == 0 || cols == 0) {
    if (out.dweight.defined()) fill_(out.dweight, 0.0);
    if (out.dbias.defined()) fill_(out.dbias, 0.0);
  } else if (out.dx.defined() || out.dweight.defined() || out.dbias.defined()) {
    layer_norm_backward_stub.call(x.device(), "layer_norm_backward")(
        out.dx, out.dweight, out.dbias, contiguous(to_dtype(grad, x.dtype())), contiguous(x), mean, rstd, w, rows,
        cols);
  }
  if (out.dweight.defined()) out.dweight = to_dtype(out.dweight, weight.dtype());
  if (out.dbias.defined()) out.dbias = to_dtype(out.dbias, bias.dtype());
  return out;
}

}  // namespace ember::native
