// ResNet with Hugging Face transformers' module tree and parameter names (ResNetModel,
// ResNetForImageClassification), so checkpoints move between the two:
// resnet.embedder.embedder.convolution.weight, resnet.encoder.stages.0.layers.0.layer.1.normalization.running_mean, ...
// Basic (two 3x3 convolutions) and bottleneck (1x1, 3x3, 1x1) residual layers, batch norm after
// every convolution, a 7x7 stride-2 stem and 3x3 max pooling, global average pooling, a linear
// classifier.
#pragma once
#include <memory>
#include <string>

#include "core/batch.h"
#include "nn/io/json_config.h"
#include "nn/layers/basic.h"
#include "nn/layers/containers.h"
#include "nn/layers/conv.h"
#include "nn/layers/normalization.h"
#include "nn/layers/pooling.h"
#include "nn/models/pretrained_model.h"
#include "nn/models/resnet_config.h"

namespace ember::nn {

// Convolution (no bias, "same"-style padding k / 2), batch norm, then the activation unless none.
class ResNetConvLayer : public Module {
 public:
  ResNetConvLayer(int64_t in_channels, int64_t out_channels, int64_t kernel_size = 3, int64_t stride = 1,
                  const std::string& activation = "relu");
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Conv2d> convolution;
  std::shared_ptr<BatchNormBase> normalization;  // BatchNorm2d, or SyncBatchNorm once converted
  std::string activation;  // empty: none

 protected:
  ResNetConvLayer(const char* type_name, int64_t in_channels, int64_t out_channels, int64_t kernel_size,
                  int64_t stride, const std::string& activation);
  bool on_child_replaced(const std::string& name, const std::shared_ptr<Module>& old,
                         const std::shared_ptr<Module>& module) override;
};

// The projection of the residual when the width or the resolution changes: a 1x1 convolution
// layer without activation, under transformers' own class name.
class ResNetShortCut : public ResNetConvLayer {
 public:
  ResNetShortCut(int64_t in_channels, int64_t out_channels, int64_t stride)
      : ResNetConvLayer("ResNetShortCut", in_channels, out_channels, 1, stride, "") {}
};

// One residual layer: activation(layer(x) + shortcut(x)); `shortcut` is null where transformers
// has nn.Identity (same width, stride 1).
class ResNetResidualLayer : public Module {
 public:
  ResNetResidualLayer(const ResNetConfig& config, int64_t in_channels, int64_t out_channels, int64_t stride);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<ResNetShortCut> shortcut;
  std::shared_ptr<Sequential> layer;
  std::string activation;
};

class ResNetStage : public Module {
 public:
  ResNetStage(const ResNetConfig& config, int64_t in_channels, int64_t out_channels, int64_t stride, int64_t depth);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Sequential> layers;
};

// The stem: a 7x7 stride-2 convolution layer and 3x3 stride-2 max pooling.
class ResNetEmbeddings : public Module {
 public:
  explicit ResNetEmbeddings(const ResNetConfig& config);
  Tensor forward(const Tensor& pixel_values) override;
  std::shared_ptr<ResNetConvLayer> embedder;
  std::shared_ptr<MaxPool2d> pooler;
  int64_t num_channels;
};

class ResNetEncoder : public Module {
 public:
  explicit ResNetEncoder(const ResNetConfig& config);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<ModuleList> stages;
};

// The ResNet models' shared base: the config, written as config.json by save_pretrained.
class ResNetPretrainedModel : public PretrainedModel {
 public:
  JsonConfig config_json() const override { return config.to_json(); }
  ResNetConfig config;

 protected:
  ResNetPretrainedModel(std::string type_name, const ResNetConfig& c);
  // transformers' _init_weights: Kaiming-normal (fan_out, ReLU) convolutions, batch norm 1 / 0.
  void init_weights();
};

struct ResNetModelOutput {
  Tensor last_hidden_state;  // [N, hidden_sizes.back(), h, w]
  Tensor pooler_output;      // [N, hidden_sizes.back(), 1, 1]
};

class ResNetModel : public ResNetPretrainedModel {
 public:
  explicit ResNetModel(const ResNetConfig& c);
  // pixel_values [N, num_channels, H, W].
  ResNetModelOutput forward_features(const Tensor& pixel_values);
  Tensor forward(const Tensor& pixel_values) override { return forward_features(pixel_values).pooler_output; }
  static std::shared_ptr<ResNetModel> from_pretrained(const std::string& dir);
  std::shared_ptr<ResNetEmbeddings> embedder;
  std::shared_ptr<ResNetEncoder> encoder;
  std::shared_ptr<AdaptiveAvgPool2d> pooler;
};

struct ImageClassifierOutput {
  Tensor loss;    // mean cross-entropy when labels were given
  Tensor logits;  // [N, num_labels]
};

class ResNetForImageClassification : public ResNetPretrainedModel {
 public:
  explicit ResNetForImageClassification(const ResNetConfig& c);
  // labels [N] (i64) optional.
  ImageClassifierOutput forward(const Tensor& pixel_values, const Tensor& labels);
  // A batch with "pixel_values" and, optionally, "labels" (as data::IdxImageDataset yields).
  ImageClassifierOutput forward(const Batch& batch);
  Tensor forward(const Tensor& pixel_values) override { return forward(pixel_values, Tensor()).logits; }
  static std::shared_ptr<ResNetForImageClassification> from_pretrained(const std::string& dir);
  std::shared_ptr<ResNetModel> resnet;
  std::shared_ptr<Sequential> classifier;  // Flatten, Linear (named classifier.1 as transformers')
};

// Loads config.json's weights into a ResNet model; a checkpoint of the bare ResNetModel
// ("embedder." keys) loads into the classifier's "resnet." and back. Every other missing or
// unexpected key is an ember::Error naming them.
LoadReport load_resnet_weights(Module& model, const std::string& dir);

}  // namespace ember::nn
