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

BertOnlyMLMHead::BertOnlyMLMHead(const BertConfig& c, const Tensor& decoder_weight) : Module("BertOnlyMLMHead") {
  predictions = register_module("predictions", std::make_shared<BertLMPredictionHead>(c, decoder_weight));
}

Tensor BertOnlyMLMHead::forward(const Tensor& hidden) {
  auto scope = enter_forward();
  return scope.exit(predictions->forward(hidden));
}

}  // namespace ember::nn
