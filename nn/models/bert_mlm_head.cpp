#include "nn/models/bert_mlm_head.h"

#include <utility>

#include "core/factory.h"
#include "core/ops.h"
#include "nn/models/bert_layers.h"

namespace ember::nn {

BertPredictionHeadTransform::BertPredictionHeadTransform(const BertConfig& c)
    : Module("BertPredictionHeadTransform"), act(c.hidden_act) {
  dense = register_module("dense", std::make_shared<Linear>(c.hidden_size, c.hidden_size));
  layer_norm = register_module("LayerNorm", std::make_shared<LayerNorm>(Shape{c.hidden_size}, c.layer_norm_eps));
}

Tensor BertPredictionHeadTransform::forward(const Tensor& x) {
  auto scope = enter_forward();
  return scope.exit(layer_norm->forward(bert_dense_activation(*dense, act, x)));
}

TiedLinear::TiedLinear(const Tensor& w, const Tensor& b) : Module("Linear") {
  weight = register_parameter("weight", w);
  bias = register_parameter("bias", b);
}

Tensor TiedLinear::forward(const Tensor& x) {
  auto scope = enter_forward();
  return scope.exit(linear(x, weight, bias));
}

namespace {
constexpr int64_t kIgnoreIndex = -100;

// The post hooks of `scope` on the logits; logits replaced by a hook get their own loss.
MlmHeadOutput exit_with_loss(Module::ForwardScope& scope, MlmHeadOutput out, const Tensor& targets) {
  Tensor logits = scope.exit(out.logits);
  if (logits.impl() != out.logits.impl())
    out.loss = cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}), kIgnoreIndex);
  out.logits = std::move(logits);
  return out;
}
}  // namespace

MlmHeadOutput TiedLinear::forward_with_loss(const Tensor& x, const Tensor& targets) {
  auto scope = enter_forward();
  auto [logits, loss] = linear_cross_entropy(x, weight, bias, targets, kIgnoreIndex);
  return exit_with_loss(scope, {logits, loss}, targets);
}

BertLMPredictionHead::BertLMPredictionHead(const BertConfig& c, const Tensor& decoder_weight)
    : Module("BertLMPredictionHead") {
  auto made_transform = std::make_shared<BertPredictionHeadTransform>(c);
  // Registered before the children, as transformers' parameter order has it: the tied tensors
  // are then listed (and saved) once, as cls.predictions.bias and the word embeddings.
  bias = register_parameter("bias", zeros({c.vocab_size}, {DType::f32, Device::cpu(), true}));
  transform = register_module("transform", std::move(made_transform));
  decoder = register_module("decoder", std::make_shared<TiedLinear>(decoder_weight, bias));
}

Tensor BertLMPredictionHead::forward(const Tensor& hidden) {
  auto scope = enter_forward();
  return scope.exit(decoder->forward(transform->forward(hidden)));
}

MlmHeadOutput BertLMPredictionHead::forward_with_loss(const Tensor& hidden, const Tensor& targets) {
  auto scope = enter_forward();
  return exit_with_loss(scope, decoder->forward_with_loss(transform->forward(hidden), targets), targets);
}

BertOnlyMLMHead::BertOnlyMLMHead(const BertConfig& c, const Tensor& decoder_weight) : Module("BertOnlyMLMHead") {
  predictions = register_module("predictions", std::make_shared<BertLMPredictionHead>(c, decoder_weight));
}

Tensor BertOnlyMLMHead::forward(const Tensor& hidden) {
  auto scope = enter_forward();
  return scope.exit(predictions->forward(hidden));
}

MlmHeadOutput BertOnlyMLMHead::forward_with_loss(const Tensor& hidden, const Tensor& targets) {
  auto scope = enter_forward();
  return exit_with_loss(scope, predictions->forward_with_loss(hidden, targets), targets);
}

}  // namespace ember::nn
