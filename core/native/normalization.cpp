#include "core/native/normalization.h"

#include <limits>

#include "core/native/copy.h"
#include "core/native/elementwise.h"

namespace ember::native {

EMBER_DEFINE_STUB(softmax_stub);
EMBER_DEFINE_STUB(softmax_backward_stub);
EMBER_DEFINE_STUB(layer_norm_stub);
EMBER_DEFINE_STUB(layer_norm_backward_stub);
EMBER_DEFINE_STUB(batch_norm_stats_stub);
EMBER_DEFINE_STUB(batch_norm_gather_stub);
EMBER_DEFINE_STUB(batch_norm_elemt_stub);
EMBER_DEFINE_STUB(batch_norm_backward_reduce_stub);
EMBER_DEFINE_STUB(batch_norm_backward_elemt_stub);
EMBER_DEFINE_STUB(batch_norm_library_forward_stub);
EMBER_DEFINE_STUB(batch_norm_library_backward_stub);
EMBER_DEFINE_STUB(batch_norm_fused_forward_stub);
EMBER_DEFINE_STUB(batch_norm_fused_backward_stub);
EMBER_DEFINE_STUB(group_norm_stub);
EMBER_DEFINE_STUB(group_norm_backward_stub);
EMBER_DEFINE_STUB(rms_norm_stub);
EMBER_DEFINE_STUB(rms_norm_backward_stub);

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

// Checks weight or bias against `expected` (normalized_shape, or [C]); returns it contiguous in
// `dtype` (or undefined).
Tensor affine_param(const Tensor& p, const char* what, const Tensor& x, const Shape& expected, DType dtype,
                    const char* op = "layer_norm", const char* expected_name = "normalized_shape") {
  if (!p.defined()) return p;
  EMBER_CHECK(p.shape() == expected, op, ": ", what, " of shape ", p.shape(), " does not match ", expected_name, " ",
              expected, " (input of shape ", x.shape(), ")");
  EMBER_CHECK(is_floating(p.dtype()), op, ": ", what, " must be floating point, got ", dtype_name(p.dtype()));
  EMBER_CHECK(p.device() == x.device(), op, ": ", what, " is on ", p.device(), " but the input is on ", x.device());
  return contiguous(to_dtype(p, dtype));
}

// Rows and columns of x viewed as [rows, prod(normalized_shape)], after checking the shapes.
std::pair<int64_t, int64_t> layer_norm_rows_cols(const Tensor& x, const Shape& normalized_shape,
                                                 const char* op = "layer_norm") {
  const int64_t k = int64_t(normalized_shape.size());
  EMBER_CHECK(k >= 1, op, ": normalized_shape must have at least one dim (input of shape ", x.shape(), ")");
  bool matches = x.dim() >= k;
  for (int64_t i = 0; matches && i < k; ++i)
    matches = x.shape()[size_t(x.dim() - k + i)] == normalized_shape[size_t(i)];
  EMBER_CHECK(matches, op, ": normalized_shape ", normalized_shape,
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

// ---- batch norm

namespace {

void check_floating_input(const Tensor& x, const char* op) {
  EMBER_CHECK(is_floating(x.dtype()), op, ": expected a floating-point input, got ", dtype_name(x.dtype()),
              " of shape ", x.shape());
}

// A [C] statistics tensor (mean, invstd, sums) after checking its shape and device.
void check_channel_vector(const Tensor& t, const char* what, const Tensor& x, int64_t channels, const char* op) {
  EMBER_CHECK(t.defined(), op, ": ", what, " is undefined");
  EMBER_CHECK(t.shape() == Shape{channels}, op, ": ", what, " of shape ", t.shape(), " does not match the ",
              channels, " channels of the input of shape ", x.shape());
  EMBER_CHECK(t.device() == x.device(), op, ": ", what, " is on ", t.device(), " but the input is on ", x.device());
}

Tensor as_stats(const Tensor& t, DType sd) { return t.defined() ? contiguous(to_dtype(t, sd)) : t; }

Tensor f64_channel_vector(int64_t channels, Device device) { return make_tensor({channels}, DType::f64, device); }

// dweight = sum_dy_xmu * invstd and dbias = sum_dy, when asked for, in the parameters' dtypes.
void add_param_grads(BatchNormReduced& r, const Tensor& invstd, const Tensor& weight, const Tensor& bias,
                     bool need_dweight, bool need_dbias) {
  if (need_dweight && weight.defined())
    r.dweight = to_dtype(binary(BinaryOp::Mul, r.sum_dy_xmu, invstd), weight.dtype());
  if (need_dbias && bias.defined()) r.dbias = to_dtype(r.sum_dy, bias.dtype());
}

// The stub's kernel for `d`, or null where none is registered (no error: the pieces serve).
template <typename Fn>
Fn optional_kernel(const DispatchStub<Fn>& stub, Device d) {
  return d.is_cpu() ? stub.cpu : stub.cuda;
}

// The channel geometry of a batch norm backward's input, after checking the gradient's shape
// and the statistics.
ChannelGeometry checked_backward_geometry(const Tensor& grad_out, const Tensor& input, const Tensor& mean,
                                          const Tensor& invstd, const char* op) {
  EMBER_CHECK(grad_out.shape() == input.shape(), op, ": gradient of shape ", grad_out.shape(),
              " does not match the input of shape ", input.shape());
  const ChannelGeometry g = channel_geometry(input, op);
  check_channel_vector(mean, "mean", input, g.c, op);
  check_channel_vector(invstd, "invstd", input, g.c, op);
  return g;
}

}  // namespace

ChannelGeometry channel_geometry(const Tensor& input, const char* op) {
  EMBER_CHECK(input.dim() >= 2, op, ": expected an input of shape [N, C, *] (2 or more dims), got shape ",
              input.shape());
  ChannelGeometry g;
  g.n = input.shape()[0];
  g.c = input.shape()[1];
  for (int64_t d = 2; d < input.dim(); ++d) g.s *= input.shape()[size_t(d)];
  return g;
}

BatchNormStats batch_norm_stats(const Tensor& input) {
  check_floating_input(input, "batch_norm_stats");
  const ChannelGeometry g = channel_geometry(input, "batch_norm_stats");
  BatchNormStats st{f64_channel_vector(g.c, input.device()), f64_channel_vector(g.c, input.device()),
                    make_tensor({1}, DType::f64, input.device())};
  fill_(st.count, double(g.n * g.s));
  if (input.numel() == 0) {
    fill_(st.sum, 0.0);
    fill_(st.sumsq, 0.0);
    return st;
  }
  batch_norm_stats_stub.call(input.device(), "batch_norm_stats")(st.sum, st.sumsq, contiguous(input), g);
  return st;
}

BatchNormMeanInvstd batch_norm_gather_stats(const BatchNormStats& stats, DType x_dtype, const Tensor& running_mean,
                                            const Tensor& running_var, double momentum, double eps) {
  const char* op = "batch_norm_gather_stats";
  EMBER_CHECK(stats.sum.defined() && stats.sum.dim() == 1, op, ": expected sums of shape [C]");
  const int64_t channels = stats.sum.shape()[0];
  const Tensor& any = stats.sum;
  check_channel_vector(stats.sumsq, "sumsq", any, channels, op);
  EMBER_CHECK(stats.count.defined() && stats.count.numel() == 1, op, ": count must hold one value");
  EMBER_CHECK(running_mean.defined() == running_var.defined(), op,
              ": running_mean and running_var must both be given or both be undefined");
  const DType sd = stats_dtype(x_dtype);
  BatchNormMeanInvstd r{make_tensor({channels}, sd, any.device()), make_tensor({channels}, sd, any.device())};
  if (channels == 0) return r;
  // the kernel updates statistics in the stats dtype; others are updated through a copy
  Tensor rm = as_stats(running_mean, sd), rv = as_stats(running_var, sd);
  batch_norm_gather_stub.call(any.device(), op)(r.mean, r.invstd, rm, rv, contiguous(to_dtype(stats.sum, DType::f64)),
                                                contiguous(to_dtype(stats.sumsq, DType::f64)),
                                                contiguous(to_dtype(stats.count, DType::f64)), channels, momentum,
                                                eps);
  if (rm.defined() && !rm.is_same(running_mean)) copy_(running_mean, rm);
  if (rv.defined() && !rv.is_same(running_var)) copy_(running_var, rv);
  return r;
}

Tensor batch_norm_elemt(const Tensor& input, const Tensor& mean, const Tensor& invstd, const Tensor& weight,
                        const Tensor& bias) {
  const char* op = "batch_norm";
  check_floating_input(input, op);
  const ChannelGeometry g = channel_geometry(input, op);
  const DType sd = stats_dtype(input.dtype());
  check_channel_vector(mean, "mean", input, g.c, op);
  check_channel_vector(invstd, "invstd", input, g.c, op);
  Tensor w = affine_param(weight, "weight", input, {g.c}, sd, op, "channels");
  Tensor b = affine_param(bias, "bias", input, {g.c}, sd, op, "channels");
  Tensor y = make_tensor(input.shape(), input.dtype(), input.device());
  if (y.numel() == 0) return y;
  batch_norm_elemt_stub.call(input.device(), op)(y, contiguous(input), as_stats(mean, sd), as_stats(invstd, sd), w, b,
                                                 g);
  return y;
}

BatchNormReduced batch_norm_backward_reduce(const Tensor& grad_out, const Tensor& input, const Tensor& mean,
                                            const Tensor& invstd, const Tensor& weight, const Tensor& bias,
                                            bool need_dweight, bool need_dbias) {
  const char* op = "batch_norm_backward";
  const ChannelGeometry g = checked_backward_geometry(grad_out, input, mean, invstd, op);
  const DType sd = stats_dtype(input.dtype());
  BatchNormReduced r{f64_channel_vector(g.c, input.device()), f64_channel_vector(g.c, input.device()), {}, {}};
  if (input.numel() == 0) {
    fill_(r.sum_dy, 0.0);
    fill_(r.sum_dy_xmu, 0.0);
  } else {
    batch_norm_backward_reduce_stub.call(input.device(), op)(r.sum_dy, r.sum_dy_xmu,
                                                             contiguous(to_dtype(grad_out, input.dtype())),
                                                             contiguous(input), as_stats(mean, sd), g);
  }
  add_param_grads(r, invstd, weight, bias, need_dweight, need_dbias);
  return r;
}

Tensor batch_norm_backward_elemt(const Tensor& grad_out, const Tensor& input, const Tensor& mean,
                                 const Tensor& invstd, const Tensor& weight, const Tensor& sum_dy,
                                 const Tensor& sum_dy_xmu, const Tensor& count) {
  const char* op = "batch_norm_backward";
  const ChannelGeometry g = checked_backward_geometry(grad_out, input, mean, invstd, op);
  EMBER_CHECK(sum_dy.defined() == sum_dy_xmu.defined(), op,
              ": sum_dy and sum_dy_xmu must both be given or both be undefined");
  const DType sd = stats_dtype(input.dtype());
  const bool batch_stats = sum_dy.defined();
  if (batch_stats) {
    check_channel_vector(sum_dy, "sum_dy", input, g.c, op);
    check_channel_vector(sum_dy_xmu, "sum_dy_xmu", input, g.c, op);
    EMBER_CHECK(count.defined() && count.numel() == 1, op, ": count must hold one value");
  }
  Tensor w = affine_param(weight, "weight", input, {g.c}, sd, op, "channels");
  Tensor dx = make_tensor(input.shape(), input.dtype(), input.device());
  if (dx.numel() == 0) return dx;
  auto f64 = [](const Tensor& t) { return t.defined() ? contiguous(to_dtype(t, DType::f64)) : t; };
  batch_norm_backward_elemt_stub.call(input.device(), op)(
      dx, contiguous(to_dtype(grad_out, input.dtype())), contiguous(input), as_stats(mean, sd), as_stats(invstd, sd),
      w, f64(sum_dy), f64(sum_dy_xmu), batch_stats ? f64(count) : Tensor(), g);
  return dx;
}

void check_batch_norm_params(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                             const Tensor& weight, const Tensor& bias) {
  const char* op = "batch_norm";
  check_floating_input(input, op);
  const ChannelGeometry g = channel_geometry(input, op);
  const auto check = [&](const Tensor& t, const char* what) {
    if (!t.defined()) return;
    EMBER_CHECK(t.shape() == Shape{g.c}, op, ": ", what, " of shape ", t.shape(), " does not match the ", g.c,
                " channels of the input of shape ", input.shape());
    EMBER_CHECK(is_floating(t.dtype()), op, ": ", what, " must be floating point, got ", dtype_name(t.dtype()));
    EMBER_CHECK(t.device() == input.device(), op, ": ", what, " is on ", t.device(), " but the input is on ",
                input.device());
  };
  check(running_mean, "running_mean");
  check(running_var, "running_var");
  check(weight, "weight");
  check(bias, "bias");
  EMBER_CHECK(running_mean.defined() == running_var.defined(), op,
              ": running_mean and running_var must both be given or both be undefined");
}

void check_batch_norm_args(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                           const Tensor& weight, const Tensor& bias, bool training) {
  const char* op = "batch_norm";
  check_batch_norm_params(input, running_mean, running_var, weight, bias);
  const ChannelGeometry g = channel_geometry(input, op);
  EMBER_CHECK(training || running_mean.defined(), op,
              ": running_mean and running_var must be given when not training (input of shape ", input.shape(), ")");
  EMBER_CHECK(!training || g.n * g.s != 1, op, ": expected more than 1 value per channel when training, got input of "
              "shape ", input.shape());
}

BatchNormMeanInvstd batch_norm_fixed_stats(const Tensor& running_mean, const Tensor& running_var, DType x_dtype,
                                           double eps) {
  const DType sd = stats_dtype(x_dtype);
  return {as_stats(running_mean, sd),
          to_dtype(unary(UnaryOp::Rsqrt, binary(BinaryOp::Add, to_dtype(running_var, sd), eps)), sd)};
}

// ---- batch norm in training, fused

BatchNormFusedForward batch_norm_fused_forward(const Tensor& input, const Tensor& weight, const Tensor& bias,
                                               const Tensor& running_mean, const Tensor& running_var, double momentum,
                                               double eps) {
  const char* op = "batch_norm";
  const auto kernel = optional_kernel(batch_norm_fused_forward_stub, input.device());
  if (kernel == nullptr || input.numel() == 0) return {};
  const ChannelGeometry g = channel_geometry(input, op);
  const DType sd = stats_dtype(input.dtype());
  const Tensor x = contiguous(input);
  const Tensor w = affine_param(weight, "weight", x, {g.c}, sd, op, "channels");
  const Tensor b = affine_param(bias, "bias", x, {g.c}, sd, op, "channels");
  // the kernel updates statistics in the stats dtype; others are updated through a copy
  const Tensor rm = as_stats(running_mean, sd), rv = as_stats(running_var, sd);
  BatchNormFusedForward r;
  r.y = make_tensor(x.shape(), x.dtype(), x.device());
  r.stats = {make_tensor({g.c}, sd, x.device()), make_tensor({g.c}, sd, x.device())};
  if (!kernel(r.y, r.stats.mean, r.stats.invstd, rm, rv, x, w, b, g, momentum, eps)) return {};
  if (rm.defined() && !rm.is_same(running_mean)) copy_(running_mean, rm);
  if (rv.defined() && !rv.is_same(running_var)) copy_(running_var, rv);
  r.count = make_tensor({1}, DType::f64, x.device());
  fill_(r.count, double(g.n * g.s));
  r.done = true;
  return r;
}

BatchNormFusedGrads batch_norm_fused_backward(const Tensor& grad_out, const Tensor& input, const Tensor& mean,
                                              const Tensor& invstd, const Tensor& weight, const Tensor& bias,
                                              bool need_dweight, bool need_dbias) {
  const char* op = "batch_norm_backward";
  const auto kernel = optional_kernel(batch_norm_fused_backward_stub, input.device());
  if (kernel == nullptr || input.numel() == 0) return {};
  const ChannelGeometry g = checked_backward_geometry(grad_out, input, mean, invstd, op);
  const DType sd = stats_dtype(input.dtype());
  const Tensor x = contiguous(input);
  const Tensor w = affine_param(weight, "weight", x, {g.c}, sd, op, "channels");
  BatchNormFusedGrads r;
  r.dx = make_tensor(x.shape(), x.dtype(), x.device());
  r.reduced.sum_dy = f64_channel_vector(g.c, x.device());
  r.reduced.sum_dy_xmu = f64_channel_vector(g.c, x.device());
  if (!kernel(r.dx, r.reduced.sum_dy, r.reduced.sum_dy_xmu, contiguous(to_dtype(grad_out, x.dtype())), x,
              as_stats(mean, sd), as_stats(invstd, sd), w, g))
    return {};
  add_param_grads(r.reduced, invstd, weight, bias, need_dweight, need_dbias);
  r.done = true;
  return r;
}

// ---- batch norm through a library

namespace {

// weight or bias as the library takes it: contiguous f32 [C], `fill` where undefined.
Tensor library_param(const Tensor& p, const char* what, const Tensor& x, int64_t channels, double fill) {
  if (p.defined()) return affine_param(p, what, x, {channels}, DType::f32, "batch_norm", "channels");
  Tensor t = make_tensor({channels}, DType::f32, x.device());
  fill_(t, fill);
  return t;
}

}  // namespace

BatchNormLibraryForward batch_norm_library_forward(const Tensor& input, const Tensor& weight, const Tensor& bias,
                                                   const Tensor& running_mean, const Tensor& running_var,
                                                   bool training, double momentum, double eps) {
  const auto kernel = optional_kernel(batch_norm_library_forward_stub, input.device());
  // the library computes the [C] tensors in f32: f64 input keeps to the pieces
  if (kernel == nullptr || input.numel() == 0 || stats_dtype(input.dtype()) != DType::f32) return {};
  const ChannelGeometry g = channel_geometry(input, "batch_norm");
  const Tensor x = contiguous(input);
  const Tensor w = library_param(weight, "weight", x, g.c, 1.0), b = library_param(bias, "bias", x, g.c, 0.0);
  // the library updates f32 statistics in place; others are updated through a copy
  const Tensor rm = as_stats(running_mean, DType::f32), rv = as_stats(running_var, DType::f32);
  BatchNormLibraryForward r;
  r.y = make_tensor(x.shape(), x.dtype(), x.device());
  if (training) {
    r.mean = make_tensor({g.c}, DType::f32, x.device());
    r.invstd = make_tensor({g.c}, DType::f32, x.device());
  }
  if (!kernel(r.y, r.mean, r.invstd, x, w, b, rm, rv, g, training, momentum, eps)) return {};
  if (training && rm.defined() && !rm.is_same(running_mean)) copy_(running_mean, rm);
  if (training && rv.defined() && !rv.is_same(running_var)) copy_(running_var, rv);
  r.done = true;
  return r;
}

BatchNormLibraryGrads batch_norm_library_backward(const Tensor& grad_out, const Tensor& input, const Tensor& weight,
                                                  const Tensor& bias, const Tensor& mean, const Tensor& invstd,
                                                  double eps, bool need_dweight, bool need_dbias) {
  const char* op = "batch_norm_backward";
  const auto kernel = optional_kernel(batch_norm_library_backward_stub, input.device());
  if (kernel == nullptr || input.numel() == 0 || stats_dtype(input.dtype()) != DType::f32) return {};
  EMBER_CHECK(grad_out.shape() == input.shape(), op, ": gradient of shape ", grad_out.shape(),
              " does not match the input of shape ", input.shape());
  const ChannelGeometry g = channel_geometry(input, op);
  check_channel_vector(mean, "mean", input, g.c, op);
  check_channel_vector(invstd, "invstd", input, g.c, op);
  const Tensor x = contiguous(input);
  const Tensor w = library_param(weight, "weight", x, g.c, 1.0);
  BatchNormLibraryGrads r;
  r.dx = make_tensor(x.shape(), x.dtype(), x.device());
  Tensor dw = make_tensor({g.c}, DType::f32, x.device()), db = make_tensor({g.c}, DType::f32, x.device());
  if (!kernel(r.dx, dw, db, contiguous(to_dtype(grad_out, x.dtype())), x, w, as_stats(mean, DType::f32),
              as_stats(invstd, DType::f32), g, eps))
    return {};
  if (need_dweight && weight.defined()) r.dweight = to_dtype(dw, weight.dtype());
  if (need_dbias && bias.defined()) r.dbias = to_dtype(db, bias.dtype());
  r.done = true;
  return r;
}

// ---- group norm

namespace {

ChannelGeometry group_norm_geometry(const Tensor& x, int64_t num_groups, const char* op) {
  check_floating_input(x, op);
  const ChannelGeometry g = channel_geometry(x, op);
  EMBER_CHECK(num_groups > 0, op, ": num_groups must be positive, got ", num_groups);
  EMBER_CHECK(g.c % num_groups == 0, op, ": num_groups ", num_groups, " does not divide the ", g.c,
              " channels of the input of shape ", x.shape());
  return g;
}

}  // namespace

GroupNormResult group_norm(const Tensor& input, int64_t num_groups, const Tensor& weight, const Tensor& bias,
                           double eps) {
  const char* op = "group_norm";
  const ChannelGeometry g = group_norm_geometry(input, num_groups, op);
  EMBER_CHECK(eps >= 0, op, ": eps must be non-negative, got ", eps);
  const DType sd = stats_dtype(input.dtype());
  Tensor w = affine_param(weight, "weight", input, {g.c}, sd, op, "channels");
  Tensor b = affine_param(bias, "bias", input, {g.c}, sd, op, "channels");
  GroupNormResult r{make_tensor(input.shape(), input.dtype(), input.device()),
                    make_tensor({g.n * num_groups}, sd, input.device()),
                    make_tensor({g.n * num_groups}, sd, input.device())};
  if (input.numel() == 0) return r;
  group_norm_stub.call(input.device(), op)(r.y, r.mean, r.rstd, contiguous(input), w, b, g, num_groups, eps);
  return r;
}

GroupNormGrads group_norm_backward(const Tensor& grad_out, const Tensor& input, int64_t num_groups,
                                   const Tensor& mean, const Tensor& rstd, const Tensor& weight, const Tensor& bias,
                                   bool need_dx, bool need_dweight, bool need_dbias) {
  const char* op = "group_norm_backward";
  EMBER_CHECK(grad_out.shape() == input.shape(), op, ": gradient of shape ", grad_out.shape(),
              " does not match the input of shape ", input.shape());
  const ChannelGeometry g = group_norm_geometry(input, num_groups, op);
  const DType sd = stats_dtype(input.dtype());
  Tensor w = affine_param(weight, "weight", input, {g.c}, sd, op, "channels");
  GroupNormGrads out;
  if (need_dx) out.dx = make_tensor(input.shape(), input.dtype(), input.device());
  if (need_dweight && weight.defined()) out.dweight = make_tensor({g.c}, sd, input.device());
  if (need_dbias && bias.defined()) out.dbias = make_tensor({g.c}, sd, input.device());
  if (input.numel() == 0) {
    if (out.dweight.defined()) fill_(out.dweight, 0.0);
    if (out.dbias.defined()) fill_(out.dbias, 0.0);
  } else if (out.dx.defined() || out.dweight.defined() || out.dbias.defined()) {
    group_norm_backward_stub.call(input.device(), op)(out.dx, out.dweight, out.dbias,
                                                      contiguous(to_dtype(grad_out, input.dtype())),
                                                      contiguous(input), mean, rstd, w, g, num_groups);
  }
  if (out.dweight.defined()) out.dweight = to_dtype(out.dweight, weight.dtype());
  if (out.dbias.defined()) out.dbias = to_dtype(out.dbias, bias.dtype());
  return out;
}

// ---- RMS norm

double rms_norm_default_eps(DType x_dtype) {
  return x_dtype == DType::f64 ? std::numeric_limits<double>::epsilon() : double(std::numeric_limits<float>::epsilon());
}

RmsNormResult rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, double eps) {
  const char* op = "rms_norm";
  check_floating_input(x, op);
  EMBER_CHECK(eps >= 0, op, ": eps must be non-negative, got ", eps);
  const auto [rows, cols] = layer_norm_rows_cols(x, normalized_shape, op);
  const DType sd = stats_dtype(x.dtype());
  Tensor w = affine_param(weight, "weight", x, normalized_shape, sd, op);
  RmsNormResult r{make_tensor(x.shape(), x.dtype(), x.device()), make_tensor({rows}, sd, x.device())};
  if (x.numel() == 0) return r;
  rms_norm_stub.call(x.device(), op)(r.y, r.rstd, contiguous(x), w, rows, cols, eps);
  return r;
}

RmsNormGrads rms_norm_backward(const Tensor& grad_out, const Tensor& x, const Shape& normalized_shape,
                               const Tensor& rstd, const Tensor& weight, bool need_dx, bool need_dweight) {
  const char* op = "rms_norm_backward";
  EMBER_CHECK(grad_out.shape() == x.shape(), op, ": gradient of shape ", grad_out.shape(),
              " does not match the input of shape ", x.shape());
  const auto [rows, cols] = layer_norm_rows_cols(x, normalized_shape, op);
  const DType sd = stats_dtype(x.dtype());
  Tensor w = affine_param(weight, "weight", x, normalized_shape, sd, op);
  RmsNormGrads out;
  if (need_dx) out.dx = make_tensor(x.shape(), x.dtype(), x.device());
  if (need_dweight && weight.defined()) out.dweight = make_tensor(normalized_shape, sd, x.device());
  if (rows == 0 || cols == 0) {
    if (out.dweight.defined()) fill_(out.dweight, 0.0);
  } else if (out.dx.defined() || out.dweight.defined()) {
    rms_norm_backward_stub.call(x.device(), op)(out.dx, out.dweight, contiguous(to_dtype(grad_out, x.dtype())),
                                                contiguous(x), rstd, w, rows, cols);
  }
  if (out.dweight.defined()) out.dweight = to_dtype(out.dweight, weight.dtype());
  return out;
}

}  // namespace ember::native
