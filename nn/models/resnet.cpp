#include "nn/models/resnet.h"

#include <utility>

#include "core/grad_mode.h"
#include "core/ops.h"
#include "nn/init.h"
#include "nn/io/safetensors.h"
#include "nn/models/base_prefix.h"

namespace ember::nn {

namespace {

// transformers' ACT2FN for the activations a ResNetConfig may name.
Tensor activate(const Tensor& x, const std::string& name) {
  if (name.empty()) return x;
  if (name == "relu") return relu(x);
  if (name == "silu" || name == "swish") return silu(x);
  if (name == "gelu") return gelu(x);
  if (name == "tanh") return tanh(x);
  EMBER_FAIL("ResNet: unsupported activation '", name, "'");
}

std::shared_ptr<Conv2d> conv(int64_t in, int64_t out, int64_t kernel, int64_t stride) {
  return std::make_shared<Conv2d>(ConvOptions{.in_channels = in,
                                              .out_channels = out,
                                              .kernel_size = {kernel},
                                              .stride = {stride},
                                              .padding = kernel / 2,
                                              .bias = false});
}

}  // namespace

ResNetConvLayer::ResNetConvLayer(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride,
                                 const std::string& activation)
    : ResNetConvLayer("ResNetConvLayer", in_channels, out_channels, kernel_size, stride, activation) {}

ResNetConvLayer::ResNetConvLayer(const char* type_name, int64_t in_channels, int64_t out_channels, int64_t kernel_size,
                                 int64_t stride, const std::string& activation)
    : Module(type_name),
      convolution(conv(in_channels, out_channels, kernel_size, stride)),
      normalization(std::make_shared<BatchNorm2d>(out_channels)),
      activation(activation) {
  add_child("convolution", convolution);
  add_child("normalization", normalization);
}

// convert_sync_batchnorm swaps the batch norm for a SyncBatchNorm: forward follows it.
bool ResNetConvLayer::on_child_replaced(const std::string& name, const std::shared_ptr<Module>&,
                                        const std::shared_ptr<Module>& module) {
  auto norm = std::dynamic_pointer_cast<BatchNormBase>(module);
  if (name != "normalization" || !norm) return false;
  normalization = std::move(norm);
  return true;
}

Tensor ResNetConvLayer::forward(const Tensor& x) {
  auto scope = enter_forward();
  return scope.exit(activate(normalization->forward(convolution->forward(x)), activation));
}

ResNetResidualLayer::ResNetResidualLayer(const ResNetConfig& config, int64_t in_channels, int64_t out_channels,
                                         int64_t stride)
    : Module(config.layer_type == "bottleneck" ? "ResNetBottleNeckLayer" : "ResNetBasicLayer"),
      layer(std::make_shared<Sequential>()),
      activation(config.hidden_act) {
  if (in_channels != out_channels || stride != 1) {
    shortcut = std::make_shared<ResNetShortCut>(in_channels, out_channels, stride);
    add_child("shortcut", shortcut);
  }
  if (config.layer_type == "bottleneck") {
    // The 1x1 layers reduce the width by 4 around the 3x3 one, which downsamples unless
    // downsample_in_bottleneck moves the stride to the first 1x1.
    const int64_t reduced = out_channels / 4;
    const bool first = config.downsample_in_bottleneck;
    layer->push_back(std::make_shared<ResNetConvLayer>(in_channels, reduced, 1, first ? stride : 1, config.hidden_act));
    layer->push_back(std::make_shared<ResNetConvLayer>(reduced, reduced, 3, first ? 1 : stride, config.hidden_act));
    layer->push_back(std::make_shared<ResNetConvLayer>(reduced, out_channels, 1, 1, ""));
  } else {
    layer->push_back(std::make_shared<ResNetConvLayer>(in_channels, out_channels, 3, stride, config.hidden_act));
    layer->push_back(std::make_shared<ResNetConvLayer>(out_channels, out_channels, 3, 1, ""));
  }
  add_child("layer", layer);
}

Tensor ResNetResidualLayer::forward(const Tensor& x) {
  auto scope = enter_forward();
  Tensor residual = shortcut ? shortcut->forward(x) : x;
  return scope.exit(activate(add(layer->forward(x), residual), activation));
}

ResNetStage::ResNetStage(const ResNetConfig& config, int64_t in_channels, int64_t out_channels, int64_t stride,
                         int64_t depth)
    : Module("ResNetStage"), layers(std::make_shared<Sequential>()) {
  layers->push_back(std::make_shared<ResNetResidualLayer>(config, in_channels, out_channels, stride));
  for (int64_t i = 1; i < depth; ++i)
    layers->push_back(std::make_shared<ResNetResidualLayer>(config, out_channels, out_channels, 1));
  add_child("layers", layers);
}

Tensor ResNetStage::forward(const Tensor& x) {
  auto scope = enter_forward();
  return scope.exit(layers->forward(x));
}

ResNetEmbeddings::ResNetEmbeddings(const ResNetConfig& config)
    : Module("ResNetEmbeddings"),
      embedder(std::make_shared<ResNetConvLayer>(config.num_channels, config.embedding_size, 7, 2, config.hidden_act)),
      pooler(std::make_shared<MaxPool2d>(Shape{3}, Shape{2}, Shape{1})),
      num_channels(config.num_channels) {
  add_child("embedder", embedder);
  add_child("pooler", pooler);
}

Tensor ResNetEmbeddings::forward(const Tensor& pixel_values) {
  auto scope = enter_forward();
  EMBER_CHECK(pixel_values.dim() == 4 && pixel_values.size(1) == num_channels, "ResNet: pixel_values must be [N, ",
              num_channels, ", H, W] (num_channels from the config), got ", pixel_values.shape());
  return scope.exit(pooler->forward(embedder->forward(pixel_values)));
}

ResNetEncoder::ResNetEncoder(const ResNetConfig& config) : Module("ResNetEncoder"), stages(std::make_shared<ModuleList>()) {
  const auto& sizes = config.hidden_sizes;
  stages->push_back(std::make_shared<ResNetStage>(config, config.embedding_size, sizes[0],
                                                  config.downsample_in_first_stage ? 2 : 1, config.depths[0]));
  for (size_t i = 1; i < sizes.size(); ++i)
    stages->push_back(std::make_shared<ResNetStage>(config, sizes[i - 1], sizes[i], 2, config.depths[i]));
  add_child("stages", stages);
}

Tensor ResNetEncoder::forward(const Tensor& x) {
  auto scope = enter_forward();
  Tensor h = x;
  for (const auto& stage : *stages) h = stage->forward(h);
  return scope.exit(h);
}

ResNetPretrainedModel::ResNetPretrainedModel(std::string type_name, const ResNetConfig& c)
    : PretrainedModel(std::move(type_name)), config(c) {
  config.validate();
}

void ResNetPretrainedModel::init_weights() {
  NoGradGuard no_grad;
  for (auto& [name, p] : named_parameters()) {
    const bool batch_norm = name.find("normalization.") != std::string::npos;
    if (batch_norm && name.ends_with(".weight")) {
      p.fill_(1.0);
    } else if (batch_norm && name.ends_with(".bias")) {
      p.fill_(0.0);
    } else if (name.find("convolution.weight") != std::string::npos) {
      init::kaiming_normal_(p, 0.0, "fan_out");
    }
  }
}

ResNetModel::ResNetModel(const ResNetConfig& c)
    : ResNetPretrainedModel("ResNetModel", c),
      embedder(std::make_shared<ResNetEmbeddings>(config)),
      encoder(std::make_shared<ResNetEncoder>(config)),
      pooler(std::make_shared<AdaptiveAvgPool2d>(Shape{1})) {
  add_child("embedder", embedder);
  add_child("encoder", encoder);
  add_child("pooler", pooler);
  init_weights();
}

ResNetModelOutput ResNetModel::forward_features(const Tensor& pixel_values) {
  auto scope = enter_forward();
  ResNetModelOutput out;
  out.last_hidden_state = encoder->forward(embedder->forward(pixel_values));
  out.pooler_output = pooler->forward(out.last_hidden_state);
  return scope.exit(std::move(out), &ResNetModelOutput::last_hidden_state, &ResNetModelOutput::pooler_output);
}

ResNetForImageClassification::ResNetForImageClassification(const ResNetConfig& c)
    : ResNetPretrainedModel("ResNetForImageClassification", c),
      resnet(std::make_shared<ResNetModel>(config)),
      classifier(std::make_shared<Sequential>()) {
  classifier->push_back(std::make_shared<Flatten>());
  classifier->push_back(std::make_shared<Linear>(config.hidden_sizes.back(), config.num_labels));
  add_child("resnet", resnet);
  add_child("classifier", classifier);
}

ImageClassifierOutput ResNetForImageClassification::forward(const Tensor& pixel_values, const Tensor& labels) {
  auto scope = enter_forward();
  ImageClassifierOutput out;
  out.logits = model_output(classifier->forward(resnet->forward_features(pixel_values).pooler_output));
  if (labels.defined()) out.loss = cross_entropy(out.logits.to(DType::f32), labels.view({-1}));
  return scope.exit(std::move(out), &ImageClassifierOutput::loss, &ImageClassifierOutput::logits);
}

ImageClassifierOutput ResNetForImageClassification::forward(const Batch& batch) {
  EMBER_CHECK(batch.contains("pixel_values"), "ResNetForImageClassification: the batch has no \"pixel_values\"");
  return forward(batch.at("pixel_values"), batch.get("labels"));
}

LoadReport load_resnet_weights(Module& model, const std::string& dir) {
  const StateDict sd =
      match_base_model_prefix(load_safetensors(dir + "/model.safetensors"), model, "resnet.", "embedder.embedder.convolution.weight");
  LoadReport r = model.load_state_dict(sd, /*strict=*/false);
  LoadReport errors = r;
  // A bare ResNetModel's checkpoint has no classifier: the classification head starts fresh,
  // as transformers does.
  std::erase_if(errors.missing_keys, [](const std::string& k) { return k.rfind("classifier.", 0) == 0; });
  std::erase_if(errors.unexpected_keys, [](const std::string& k) { return k.rfind("classifier.", 0) == 0; });
  EMBER_CHECK(errors.ok(), "from_pretrained('", dir, "'): the checkpoint does not match the model: ", errors.str());
  return r;
}

std::shared_ptr<ResNetModel> ResNetModel::from_pretrained(const std::string& dir) {
  auto model = std::make_shared<ResNetModel>(ResNetConfig::from_json_file(dir + "/config.json"));
  load_resnet_weights(*model, dir);
  return model;
}

std::shared_ptr<ResNetForImageClassification> ResNetForImageClassification::from_pretrained(const std::string& dir) {
  auto model = std::make_shared<ResNetForImageClassification>(ResNetConfig::from_json_file(dir + "/config.json"));
  load_resnet_weights(*model, dir);
  return model;
}

}  // namespace ember::nn
