// Normalisation layers beside LayerNorm (nn/layers/basic.h): BatchNorm1d, BatchNorm2d, GroupNorm
// and RMSNorm, with PyTorch's options, parameter and buffer names (so state dicts match).
#pragma once
#include <cstdint>
#include <optional>

#include "nn/module.h"

namespace ember::nn {

struct BatchNormOptions {
  double eps = 1e-5;
  // Weight of the batch statistics in the running ones; nullopt: a cumulative moving average
  // (1 / num_batches_tracked), as torch's momentum=None.
  std::optional<double> momentum = 0.1;
  bool affine = true;               // parameters weight (ones) and bias (zeros), [C]
  bool track_running_stats = true;  // buffers running_mean, running_var, num_batches_tracked
};

// What BatchNorm1d and BatchNorm2d share. In training the batch statistics normalise, and the
// running statistics (when tracked) move towards them and num_batches_tracked counts the
// batches; in evaluation the running statistics normalise (the batch ones when not tracked).
class BatchNormBase : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;                                   // undefined without affine
  Tensor running_mean, running_var, num_batches_tracked;  // undefined without track_running_stats
  int64_t num_features;
  BatchNormOptions options;

 protected:
  BatchNormBase(const char* type_name, int64_t num_features, BatchNormOptions opt);
  // Takes over `other`'s parameters and buffers (the very tensors, so optimizers and state
  // dicts holding them see this layer), its options and its training mode: the layer a
  // synchronised batch norm is converted from.
  BatchNormBase(const char* type_name, const BatchNormBase& other);
  // Throws when x's rank does not suit the layer.
  virtual void check_input_dim(const Tensor& x) const = 0;
  // Normalises x (already checked) with `momentum` for the running statistics: batch_norm with
  // the batch statistics in training or without running ones, else with the running ones.
  virtual Tensor normalize(const Tensor& x, double momentum);

 private:
  void register_state(const Tensor& w, const Tensor& b, const Tensor& mean, const Tensor& var, const Tensor& batches);
};

// Input [N, C] or [N, C, L].
class BatchNorm1d : public BatchNormBase {
 public:
  explicit BatchNorm1d(int64_t num_features, BatchNormOptions opt = {});

 protected:
  void check_input_dim(const Tensor& x) const override;
};

// Input [N, C, H, W].
class BatchNorm2d : public BatchNormBase {
 public:
  explicit BatchNorm2d(int64_t num_features, BatchNormOptions opt = {});

 protected:
  void check_input_dim(const Tensor& x) const override;
};

// Input [N, C, *], normalised over each group of num_channels / num_groups channels; parameters
// weight and bias [C] when affine.
class GroupNorm : public Module {
 public:
  GroupNorm(int64_t num_groups, int64_t num_channels, double eps = 1e-5, bool affine = true);
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;
  int64_t num_groups, num_channels;
  double eps;
};

// x / sqrt(mean(x^2 over the trailing normalized_shape) + eps) * weight; eps nullopt is the
// machine epsilon of the input's dtype. Parameter weight (ones) when elementwise_affine.
class RMSNorm : public Module {
 public:
  explicit RMSNorm(Shape normalized_shape, std::optional<double> eps = std::nullopt, bool elementwise_affine = true);
  Tensor forward(const Tensor& x) override;
  Tensor weight;
  Shape normalized_shape;
  std::optional<double> eps;
};

}  // namespace ember::nn
