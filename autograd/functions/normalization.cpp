// Differentiable softmax, log-softmax, layer norm, batch norm, group norm and RMS norm. Their backward passes run dedicated
// kernels (core/native/normalization.h) rather than chains of generic ops.
#include "autograd/functions/composed_gradient.h"
#include "autograd/functions/normalization_gradients.h"
#include "autograd/functions/softmax_gradients.h"
#include "autograd/node.h"
#include "core/autocast.h"
#include "core/factory.h"
#include "core/native/copy.h"
#include "core/native/normalization.h"
#include "core/ops.h"

namespace ember {
using autograd::Tensors;

namespace {

// What the backward of a normalisation with input x and optional affine weight and bias reads:
// which gradients are wanted, and the saved tensors (undefined ones stay undefined). x and the
// weight keep their history: under create_graph the fused kernels' gradients get that of the
// same gradients composed from differentiable ops (normalization_gradients.h).
struct AffineNormSaved {
  bool need_dx, need_dw, need_db;
  autograd::SavedTensor x, weight, bias;
  autograd::NormGradsWanted wanted() const { return {need_dx, need_dw, need_db}; }
};

AffineNormSaved save_affine_norm(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return {x.requires_grad(),
          weight.defined() && weight.requires_grad(),
          bias.defined() && bias.requires_grad(),
          autograd::save_with_history(x),
          autograd::save_with_history(weight),
          autograd::save(bias)};
}

// Records node `name` for a normalisation's output y. Its gradients are the fused kernels' values
// fused(g, x, weight, sv); under create_graph they carry the history (nodes `grad_name`) of the
// same gradients composed(g, x, weight, sv) from differentiable ops.
template <class Fused, class Composed>
void record_affine_norm(const char* name, const char* grad_name, const Tensors& inputs, const Tensor& y,
                        const AffineNormSaved& sv, Fused fused, Composed composed) {
  autograd::record(
      name, inputs, {y},
      [grad_name, sv, fused, composed](const Tensors& g) -> Tensors {
        const Tensor xv = sv.x.unpack(), wv = sv.weight.unpack();
        return autograd::with_composed_history(grad_name, fused(g[0], xv, wv, sv), {g[0], xv, wv},
                                               [&] { return composed(g[0], xv, wv, sv); });
      },
      autograd::Backward::differentiable);
}

}  // namespace

Tensor softmax(const Tensor& x_in, int64_t dim) {
  const Tensor x = autocast::to_f32(x_in);
  Tensor y = native::softmax(x, dim);
  if (autograd::needs_grad({x})) {
    autograd::SavedTensor ys = autograd::save_output(y);
    autograd::record(
        "SoftmaxBackward", {x}, {y},
        [ys, dim](const Tensors& g) -> Tensors { return {autograd::softmax_grad(g[0], ys.unpack(), dim)}; },
        autograd::Backward::differentiable);
  }
  return y;
}

Tensor log_softmax(const Tensor& x_in, int64_t dim) {
  const Tensor x = autocast::to_f32(x_in);
  Tensor y = native::log_softmax(x, dim);
  if (autograd::needs_grad({x})) {
    autograd::SavedTensor ys = autograd::save_output(y);
    autograd::record(
        "LogSoftmaxBackward", {x}, {y},
        [ys, dim](const Tensors& g) -> Tensors { return {autograd::log_softmax_grad(g[0], ys.unpack(), dim)}; },
        autograd::Backward::differentiable);
  }
  return y;
}

Tensor layer_norm(const Tensor& x_in, const Shape& normalized_shape, const Tensor& weight_in, const Tensor& bias_in,
                  double eps) {
  const Tensor x = autocast::to_f32(x_in), weight = autocast::to_f32(weight_in), bias = autocast::to_f32(bias_in);
  native::LayerNormResult r = native::layer_norm(x, normalized_shape, weight, bias, eps);
  if (autograd::needs_grad({x, weight, bias})) {
    const AffineNormSaved sv = save_affine_norm(x, weight, bias);
    Tensor mean = r.mean, rstd = r.rstd;
    record_affine_norm(
        "LayerNormBackward", "LayerNormGradBackward", {x, weight, bias}, r.y, sv,
        [=](const Tensor& g, const Tensor& xv, const Tensor& wv, const AffineNormSaved& s) -> Tensors {
          native::LayerNormGrads d = native::layer_norm_backward(g, xv, normalized_shape, mean, rstd, wv,
                                                                 s.bias.unpack(), s.need_dx, s.need_dw, s.need_db);
          return {d.dx, d.dweight, d.dbias};
        },
        [=](const Tensor& g, const Tensor& xv, const Tensor& wv, const AffineNormSaved& s) {
          return autograd::layer_norm_gradients(g, xv, normalized_shape, wv, eps, s.wanted());
        });
  }
  return r.y;
}

Tensor batch_norm(const Tensor& input_in, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight_in, const Tensor& bias_in, bool training, double momentum, double eps) {
  const Tensor x = autocast::to_f32(input_in), weight = autocast::to_f32(weight_in), bias = autocast::to_f32(bias_in);
  native::check_batch_norm_args(x, running_mean, running_var, weight, bias, training);
  const bool needs_grad = autograd::needs_grad({x, weight, bias});
  // the device's library (cuDNN) when it takes the problem, else the pieces
  native::BatchNormLibraryForward lib =
      native::batch_norm_library_forward(x, weight, bias, running_mean, running_var, training, momentum, eps);
  native::BatchNormMeanInvstd st;
  Tensor y, count;
  if (lib.done) {
    y = lib.y;
    if (training) st = {lib.mean, lib.invstd};
  } else if (training) {
    // one kernel where the device has one that takes the problem, else the pieces (the same values)
    native::BatchNormFusedForward fused =
        native::batch_norm_fused_forward(x, weight, bias, running_mean, running_var, momentum, eps);
    if (fused.done) {
      y = fused.y;
      st = fused.stats;
      count = fused.count;
    } else {
      const native::BatchNormStats sums = native::batch_norm_stats(x);
      // an empty batch has no statistics to move the running ones towards
      const bool update = x.numel() > 0;
      st = native::batch_norm_gather_stats(sums, x.dtype(), update ? running_mean : Tensor(),
                                           update ? running_var : Tensor(), momentum, eps);
      count = sums.count;
    }
  }
  if (!training && (!lib.done || needs_grad)) {
    st = native::batch_norm_fixed_stats(running_mean, running_var, x.dtype(), eps);
    st.mean = native::clone(st.mean);  // the running mean may change in place before backward
  }
  if (!y.defined()) y = native::batch_norm_elemt(x, st.mean, st.invstd, weight, bias);
  if (needs_grad) {
    const AffineNormSaved sv = save_affine_norm(x, weight, bias);
    Tensor mean = st.mean, invstd = st.invstd;
    const bool library_grads = lib.done && training;
    const int64_t values_per_channel = lib.done ? x.numel() / x.shape()[1] : 0;  // the library takes no empty input
    const auto fused = [=](const Tensor& g, const Tensor& xv, const Tensor& wv, const AffineNormSaved& s) -> Tensors {
      if (library_grads) {
        native::BatchNormLibraryGrads d = native::batch_norm_library_backward(
            g, xv, wv, s.bias.unpack(), mean, invstd, eps, s.need_dw, s.need_db);
        if (d.done) return {s.need_dx ? d.dx : Tensor(), d.dweight, d.dbias};
      }
      if (training && s.need_dx) {
        native::BatchNormFusedGrads d =
            native::batch_norm_fused_backward(g, xv, mean, invstd, wv, s.bias.unpack(), s.need_dw, s.need_db);
        if (d.done) return {d.dx, d.reduced.dweight, d.reduced.dbias};
      }
      // the library's mean and invstd are the pieces' too; only the count is to be made
      const Tensor n = count.defined() || !training
                           ? count
                           : full({1}, double(values_per_channel), {DType::f64, xv.device()});
      native::BatchNormReduced r;
      if (training || s.need_dw || s.need_db)
        r = native::batch_norm_backward_reduce(g, xv, mean, invstd, wv, s.bias.unpack(), s.need_dw, s.need_db);
      Tensor dx;
      if (s.need_dx)
        dx = training ? native::batch_norm_backward_elemt(g, xv, mean, invstd, wv, r.sum_dy, r.sum_dy_xmu, n)
                      : native::batch_norm_backward_elemt(g, xv, mean, invstd, wv, Tensor(), Tensor(), Tensor());
      return {dx, r.dweight, r.dbias};
    };
    record_affine_norm("BatchNormBackward", "BatchNormGradBackward", {x, weight, bias}, y, sv, fused,
                       [=](const Tensor& g, const Tensor& xv, const Tensor& wv, const AffineNormSaved& s) {
                         return training ? autograd::batch_norm_gradients(g, xv, wv, eps, s.wanted())
                                         : autograd::batch_norm_eval_gradients(g, xv, mean, invstd, wv, s.wanted());
                       });
  }
  return y;
}

Tensor group_norm(const Tensor& input_in, int64_t num_groups, const Tensor& weight_in, const Tensor& bias_in,
                  double eps) {
  const Tensor x = autocast::to_f32(input_in), weight = autocast::to_f32(weight_in), bias = autocast::to_f32(bias_in);
  native::GroupNormResult r = native::group_norm(x, num_groups, weight, bias, eps);
  if (autograd::needs_grad({x, weight, bias})) {
    const AffineNormSaved sv = save_affine_norm(x, weight, bias);
    Tensor mean = r.mean, rstd = r.rstd;
    record_affine_norm(
        "GroupNormBackward", "GroupNormGradBackward", {x, weight, bias}, r.y, sv,
        [=](const Tensor& g, const Tensor& xv, const Tensor& wv, const AffineNormSaved& s) -> Tensors {
          native::GroupNormGrads d = native::group_norm_backward(g, xv, num_groups, mean, rstd, wv, s.bias.unpack(),
                                                                 s.need_dx, s.need_dw, s.need_db);
          return {d.dx, d.dweight, d.dbias};
        },
        [=](const Tensor& g, const Tensor& xv, const Tensor& wv, const AffineNormSaved& s) {
          return autograd::group_norm_gradients(g, xv, num_groups, wv, eps, s.wanted());
        });
  }
  return r.y;
}

Tensor rms_norm(const Tensor& x_in, const Shape& normalized_shape, const Tensor& weight_in, std::optional<double> eps) {
  const Tensor x = autocast::to_f32(x_in), weight = autocast::to_f32(weight_in);
  const double epsilon = eps ? *eps : native::rms_norm_default_eps(x.dtype());
  native::RmsNormResult r = native::rms_norm(x, normalized_shape, weight, epsilon);
  if (autograd::needs_grad({x, weight})) {
    const AffineNormSaved sv = save_affine_norm(x, weight, Tensor());
    Tensor rstd = r.rstd;
    record_affine_norm(
        "RmsNormBackward", "RmsNormGradBackward", {x, weight}, r.y, sv,
        [=](const Tensor& g, const Tensor& xv, const Tensor& wv, const AffineNormSaved& s) -> Tensors {
          native::RmsNormGrads d = native::rms_norm_backward(g, xv, normalized_shape, rstd, wv, s.need_dx, s.need_dw);
          return {d.dx, d.dweight};
        },
        [=](const Tensor& g, const Tensor& xv, const Tensor& wv, const AffineNormSaved& s) {
          return autograd::rms_norm_gradients(g, xv, normalized_shape, wv, epsilon, s.wanted());
        });
  }
  return r.y;
}

Tensor Tensor::softmax(int64_t dim) const { return ember::softmax(*this, dim); }
Tensor Tensor::log_softmax(int64_t dim) const { return ember::log_softmax(*this, dim); }

}  // namespace ember
