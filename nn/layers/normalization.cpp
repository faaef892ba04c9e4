#include "nn/layers/normalization.h"

#include <utility>

#include "core/factory.h"
#include "core/ops.h"

namespace ember::nn {

BatchNormBase::BatchNormBase(const char* type_name, int64_t num_features_, BatchNormOptions opt)
    : Module(type_name), num_features(num_features_), options(opt) {
  EMBER_CHECK(num_features > 0, type_name, ": num_features must be positive, got ", num_features);
  EMBER_CHECK(!opt.momentum || (*opt.momentum >= 0 && *opt.momentum <= 1), type_name,
              ": momentum must be in [0, 1], got ", opt.momentum.value_or(0));
  const auto tensor_if = [](bool on, Tensor t) { return on ? t : Tensor(); };
  register_state(tensor_if(opt.affine, ones({num_features}).requires_grad_(true)),
                 tensor_if(opt.affine, zeros({num_features}).requires_grad_(true)),
                 tensor_if(opt.track_running_stats, zeros({num_features})),
                 tensor_if(opt.track_running_stats, ones({num_features})),
                 tensor_if(opt.track_running_stats, zeros({}, {DType::i64})));
}

BatchNormBase::BatchNormBase(const char* type_name, const BatchNormBase& other)
    : Module(type_name), num_features(other.num_features), options(other.options) {
  register_state(other.weight, other.bias, other.running_mean, other.running_var, other.num_batches_tracked);
  train(other.is_training());
}

void BatchNormBase::register_state(const Tensor& w, const Tensor& b, const Tensor& mean, const Tensor& var,
                                   const Tensor& batches) {
  // requires_grad as given: a frozen layer stays frozen when converted
  if (w.defined()) weight = register_parameter("weight", w, w.requires_grad());
  if (b.defined()) bias = register_parameter("bias", b, b.requires_grad());
  if (mean.defined()) {
    running_mean = register_buffer("running_mean", mean);
    running_var = register_buffer("running_var", var);
    num_batches_tracked = register_buffer("num_batches_tracked", batches);
  }
}

Tensor BatchNormBase::forward(const Tensor& x) {
  auto scope = enter_forward();
  check_input_dim(x);
  double momentum = options.momentum.value_or(0.0);
  if (is_training() && running_mean.defined()) {
    num_batches_tracked.add_(ones({}, {DType::i64, num_batches_tracked.device()}));
    // cumulative moving average: the n-th batch weighs 1 / n
    if (!options.momentum) momentum = 1.0 / double(num_batches_tracked.item<int64_t>());
  }
  return scope.exit(normalize(x, momentum));
}

Tensor BatchNormBase::normalize(const Tensor& x, double momentum) {
  // without running statistics the batch ones normalise in evaluation too
  const bool use_batch_stats = is_training() || !running_mean.defined();
  return batch_norm(x, running_mean, running_var, weight, bias, use_batch_stats, momentum, options.eps);
}

BatchNorm1d::BatchNorm1d(int64_t num_features, BatchNormOptions opt)
    : BatchNormBase("BatchNorm1d", num_features, opt) {}

void BatchNorm1d::check_input_dim(const Tensor& x) const {
  EMBER_CHECK(x.dim() == 2 || x.dim() == 3, "BatchNorm1d: expected 2D or 3D input (got ", x.dim(),
              "D input of shape ", x.shape(), ")");
}

BatchNorm2d::BatchNorm2d(int64_t num_features, BatchNormOptions opt)
    : BatchNormBase("BatchNorm2d", num_features, opt) {}

void BatchNorm2d::check_input_dim(const Tensor& x) const {
  EMBER_CHECK(x.dim() == 4, "BatchNorm2d: expected 4D input (got ", x.dim(), "D input of shape ", x.shape(), ")");
}

GroupNorm::GroupNorm(int64_t num_groups_, int64_t num_channels_, double eps_, bool affine)
    : Module("GroupNorm"), num_groups(num_groups_), num_channels(num_channels_), eps(eps_) {
  EMBER_CHECK(num_groups > 0 && num_channels % num_groups == 0, "GroupNorm: num_channels ", num_channels,
              " must be divisible by num_groups ", num_groups);
  if (affine) {
    weight = register_parameter("weight", ones({num_channels}));
    bias = register_parameter("bias", zeros({num_channels}));
  }
}

Tensor GroupNorm::forward(const Tensor& x) {
  auto scope = enter_forward();
  return scope.exit(group_norm(x, num_groups, weight, bias, eps));
}

RMSNorm::RMSNorm(Shape shape, std::optional<double> eps_, bool elementwise_affine)
    : Module("RMSNorm"), normalized_shape(std::move(shape)), eps(eps_) {
  if (elementwise_affine) weight = register_parameter("weight", ones(normalized_shape));
}

Tensor RMSNorm::forward(const Tensor& x) {
  auto scope = enter_forward();
  return scope.exit(rms_norm(x, normalized_shape, weight, eps));
}

}  // namespace ember::nn
