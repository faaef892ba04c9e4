#include "nn/models/bert.h"

#include <cmath>
#include <limits>

#include "core/autocast.h"
#include "nn/functional.h"
#include "nn/init.h"

namespace ember::nn {

namespace {
// act(dense(x)); the GELUs add the bias inside the fused activation (one pass fewer).
Tensor dense_activation(const std::string& act, const Linear& dense, const Tensor& x) {
  if (act == "relu" || !dense.bias.defined()) {
    const Tensor y = linear(x, dense.weight, dense.bias);
    if (act == "relu") return relu(y);
    return gelu(y, act != "gelu");
  }
  // "gelu" is the exact form; gelu_new / gelu_pytorch_tanh the tanh one
  return bias_gelu(linear(x, dense.weight), dense.bias, act != "gelu");
}

// layer_norm(dropout(dense(x)) + residual) as one fused op after a bias-free product.
Tensor dense_dropout_add_norm(const Linear& dense, const Dropout& dropout, const LayerNorm& norm, const Tensor& x,
                              const Tensor& residual) {
  return add_layer_norm(linear(x, dense.weight), residual, norm.normalized_shape, norm.weight, norm.bias, norm.eps,
                        dropout.p, dropout.is_training(), dense.bias);
}
}  // namespace

BertEmbeddings::BertEmbeddings(const BertConfig& c) : Module("BertEmbeddings") {
  word_embeddings = register_module("word_embeddings", std::make_shared<Embedding>(c.vocab_size, c.hidden_size, c.pad_token_id));
  position_embeddings = register_module("position_embeddings",
                                        std::make_shared<Embedding>(c.max_position_embeddings, c.hidden_size));
  token_type_embeddings = register_module("token_type_embeddings",
                                          std::make_shared<Embedding>(c.type_vocab_size, c.hidden_size));
  layer_norm = register_module("LayerNorm", std::make_shared<LayerNorm>(Shape{c.hidden_size}, c.layer_norm_eps));
  dropout = register_module("dropout", std::make_shared<Dropout>(c.hidden_dropout_prob));
}

Tensor BertEmbeddings::forward(const Tensor& input_ids, const Tensor& token_type_ids) {
  EMBER_CHECK(input_ids.dim() == 2, "BertEmbeddings: input_ids must be [batch, length], got ", input_ids.shape());
  const int64_t len = input_ids.size(1);
  const int64_t max_len = position_embeddings->num_embeddings;
  EMBER_CHECK(len <= max_len, "BertEmbeddings: sequence length ", len, " exceeds max_position_embeddings ", max_len);
  Tensor positions = arange(len, {DType::i64, input_ids.device()});
  Tensor x = word_embeddings->forward(input_ids) + position_embeddings->forward(positions);
  Tensor types = token_type_ids.defined() ? token_type_ids : zeros(input_ids.shape(), {DType::i64, input_ids.device()});
  // layer_norm(word + position + token type), the last sum fused into the norm
  x = add_layer_norm(x, token_type_embeddings->forward(types), layer_norm->normalized_shape, layer_norm->weight,
                     layer_norm->bias, layer_norm->eps);
  return dropout->forward(x);
}

BertSelfAttention::BertSelfAttention(const BertConfig& c)
    : Module("BertSelfAttention"), num_heads(c.num_attention_heads), head_dim(c.hidden_size / c.num_attention_heads) {
  query = register_module("query", std::make_shared<Linear>(c.hidden_size, c.hidden_size));
  key = register_module("key", std::make_shared<Linear>(c.hidden_size, c.hidden_size));
  value = register_module("value", std::make_shared<Linear>(c.hidden_size, c.hidden_size));
  dropout = register_module("dropout", std::make_shared<Dropout>(c.attention_probs_dropout_prob));
}

Tensor BertSelfAttention::forward(const Tensor& hidden, const Tensor& additive_mask) {
  // q, k and v from one product with the three weights stacked (cast once each under autocast);
  // the attention reads the heads in place and writes them merged: no per-head copies.
  auto stacked = [](const Linear& a, const Linear& b, const Linear& c, Tensor Linear::*p) {
    return cat({autocast::to_lower(a.*p), autocast::to_lower(b.*p), autocast::to_lower(c.*p)}, 0);
  };
  const Tensor qkv = linear(hidden, stacked(*query, *key, *value, &Linear::weight),
                            stacked(*query, *key, *value, &Linear::bias));
  return packed_self_attention(qkv, num_heads, additive_mask, dropout->p, dropout->is_training());
}

BertResidualOutput::BertResidualOutput(int64_t in, int64_t hidden, double p, double eps) : Module("BertOutput") {
  dense = register_module("dense", std::make_shared<Linear>(in, hidden));
  layer_norm = register_module("LayerNorm", std::make_shared<LayerNorm>(Shape{hidden}, eps));
  dropout = register_module("dropout", std::make_shared<Dropout>(p));
}

Tensor BertResidualOutput::forward(const Tensor& x, const Tensor& residual) {
  return dense_dropout_add_norm(*dense, *dropout, *layer_norm, x, residual);
}

BertAttention::BertAttention(const BertConfig& c) : Module("BertAttention") {
  self = register_module("self", std::make_shared<BertSelfAttention>(c));
  output = register_module("output", std::make_shared<BertResidualOutput>(c.hidden_size, c.hidden_size,
                                                                           c.hidden_dropout_prob, c.layer_norm_eps));
}

Tensor BertAttention::forward(const Tensor& hidden, const Tensor& mask) {
  return output->forward(self->forward(hidden, mask), hidden);
}

BertIntermediate::BertIntermediate(const BertConfig& c) : Module("BertIntermediate"), act(c.hidden_act) {
  dense = register_module("dense", std::make_shared<Linear>(c.hidden_size, c.intermediate_size));
}

Tensor BertIntermediate::forward(const Tensor& x) { return dense_activation(act, *dense, x); }

BertLayer::BertLayer(const BertConfig& c) : Module("BertLayer") {
  attention = register_module("attention", std::make_shared<BertAttention>(c));
  intermediate = register_module("intermediate", std::make_shared<BertIntermediate>(c));
  output = register_module("output", std::make_shared<BertResidualOutput>(c.intermediate_size, c.hidden_size,
                                                                          c.hidden_dropout_prob, c.layer_norm_eps));
}

Tensor BertLayer::forward(const Tensor& hidden, const Tensor& mask) {
  Tensor a = attention->forward(hidden, mask);
  return output->forward(intermediate->forward(a), a);
}

Tensor bert_additive_mask(const Tensor& attention_mask, DType dtype) {
  EMBER_CHECK(attention_mask.dim() == 2, "BertModel: attention_mask must be [batch, length], got ",
              attention_mask.shape());
  const double lowest = dtype == DType::f16    ? -65504.0
                        : dtype == DType::f64 ? double(std::numeric_limits<double>::lowest())
                        : dtype == DType::bf16 ? -3.3895313892515355e38
                                               : double(std::numeric_limits<float>::lowest());
  Tensor keep = attention_mask.to(DType::f32);
  Tensor additive = (1.0 - keep) * lowest;  // 0 where attended, dtype's lowest where padded
  return additive.to(dtype).unsqueeze(1).unsqueeze(1);
}

namespace {
class EncoderStack : public Module {
 public:
  explicit EncoderStack(std::shared_ptr<ModuleList> layers) : Module("BertEncoder") {
    register_module("layer", std::move(layers));
  }
};
class Pooler : public Module {
 public:
  explicit Pooler(std::shared_ptr<Linear> dense) : Module("BertPooler") { register_module("dense", std::move(dense)); }
};
}  // namespace

BertModel::BertModel(const BertConfig& c, bool add_pooling_layer) : Module("BertModel"), config(c) {
  c.validate();
  embeddings = register_module("embeddings", std::make_shared<BertEmbeddings>(c));
  encoder_layers = std::make_shared<ModuleList>();
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) encoder_layers->push_back(std::make_shared<BertLayer>(c));
  register_module("encoder", std::make_shared<EncoderStack>(encoder_layers));
  if (add_pooling_layer) {
    pooler_dense = std::make_shared<Linear>(c.hidden_size, c.hidden_size);
    register_module("pooler", std::make_shared<Pooler>(pooler_dense));
  }
  init_bert_weights(*this, c.initializer_range);
}

BertModelOutput BertModel::forward(const Tensor& input_ids, const Tensor& attention_mask, const Tensor& token_type_ids) {
  Tensor h = embeddings->forward(input_ids, token_type_ids);
  Tensor mask;
  if (attention_mask.defined()) {
    EMBER_CHECK(attention_mask.shape() == input_ids.shape(), "BertModel: attention_mask ", attention_mask.shape(),
                " does not match input_ids ", input_ids.shape());
    mask = bert_additive_mask(attention_mask, h.dtype());
  }
  for (size_t i = 0; i < encoder_layers->size(); ++i) h = encoder_layers->at<BertLayer>(i)->forward(h, mask);
  BertModelOutput out{h, Tensor()};
  if (pooler_dense) out.pooler_output = tanh(pooler_dense->forward(h.select(1, 0)));
  return out;
}

void init_bert_weights(Module& root, double range) {
  NoGradGuard ng;
  root.apply([range](Module& m) {
    if (auto* lin = dynamic_cast<Linear*>(&m)) {
      init::normal_(lin->weight, 0.0, range);
      if (lin->bias.defined()) init::zeros_(lin->bias);
    } else if (auto* emb = dynamic_cast<Embedding*>(&m)) {
      init::normal_(emb->weight, 0.0, range);
      if (emb->padding_idx) emb->weight.select(0, *emb->padding_idx).zero_();
    } else if (auto* ln = dynamic_cast<LayerNorm*>(&m)) {
      if (ln->weight.defined()) init::ones_(ln->weight);
      if (ln->bias.defined()) init::zeros_(ln->bias);
    }
  });
}

namespace {
class PredictionTransform : public Module {
 public:
  PredictionTransform(std::shared_ptr<Linear> dense, std::shared_ptr<LayerNorm> ln) : Module("BertPredictionHeadTransform") {
    register_module("dense", std::move(dense));
    register_module("LayerNorm", std::move(ln));
  }
};
class Decoder : public Module {
 public:
  Decoder(const Tensor& w, const Tensor& b) : Module("Linear") {
    register_parameter("weight", w);
    register_parameter("bias", b);
  }
};
class LMPredictionHead : public Module {
 public:
  LMPredictionHead(std::shared_ptr<Module> transform, const Tensor& decoder_w, const Tensor& bias)
      : Module("BertLMPredictionHead") {
    register_parameter("bias", bias);
    register_module("transform", std::move(transform));
    register_module("decoder", std::make_shared<Decoder>(decoder_w, bias));
  }
};
class OnlyMLMHead : public Module {
 public:
  explicit OnlyMLMHead(std::shared_ptr<Module> predictions) : Module("BertOnlyMLMHead") {
    register_module("predictions", std::move(predictions));
  }
};
}  // namespace

BertForMaskedLM::BertForMaskedLM(const BertConfig& c) : Module("BertForMaskedLM"), config(c) {
  bert = register_module("bert", std::make_shared<BertModel>(c, /*add_pooling_layer=*/false));
  transform_dense = std::make_shared<Linear>(c.hidden_size, c.hidden_size);
  transform_layer_norm = std::make_shared<LayerNorm>(Shape{c.hidden_size}, c.layer_norm_eps);
  decoder_weight = bert->embeddings->word_embeddings->weight;  // tied: the same tensor
  decoder_bias = zeros({c.vocab_size}, {DType::f32, Device::cpu(), true});
  auto transform = std::make_shared<PredictionTransform>(transform_dense, transform_layer_norm);
  auto head = std::make_shared<LMPredictionHead>(transform, decoder_weight, decoder_bias);
  register_module("cls", std::make_shared<OnlyMLMHead>(head));
  init_bert_weights(*transform, c.initializer_range);
}

ModelOutput BertForMaskedLM::forward(const Tensor& input_ids, const Tensor& attention_mask,
                                     const Tensor& token_type_ids, const Tensor& labels) {
  Tensor h = bert->forward(input_ids, attention_mask, token_type_ids).last_hidden_state;
  if (labels.defined()) {
    EMBER_CHECK(labels.shape() == input_ids.shape(), "BertForMaskedLM: labels ", labels.shape(),
                " do not match input_ids ", input_ids.shape());
  }
  Tensor targets = labels.defined() ? labels.reshape({-1}).to(DType::i64) : Tensor();
  if (sparse_prediction && labels.defined()) {
    std::vector<int64_t> rows;
    const std::vector<int64_t> lab = targets.to_vector<int64_t>();
    for (size_t i = 0; i < lab.size(); ++i)
      if (lab[i] != -100) rows.push_back(int64_t(i));
    Tensor index = from_vector(rows, {int64_t(rows.size())}).to(h.device());
    h = index_select(h.reshape({-1, h.size(-1)}), 0, index);
    targets = index_select(targets, 0, index);
  }
  h = transform_layer_norm->forward(dense_activation(config.hidden_act, *transform_dense, h));
  Tensor logits = model_output(linear(h, decoder_weight, decoder_bias));
  ModelOutput out{Tensor(), logits};
  if (labels.defined()) out.loss = cross_entropy(logits.reshape({-1, config.vocab_size}), targets, -100);
  return out;
}

ModelOutput BertForMaskedLM::forward(const Batch& b) {
  return forward(b.at("input_ids"), b.get("attention_mask"), b.get("token_type_ids"), b.get("labels"));
}

BertForSequenceClassification::BertForSequenceClassification(const BertConfig& c)
    : Module("BertForSequenceClassification"), config(c) {
  bert = register_module("bert", std::make_shared<BertModel>(c, /*add_pooling_layer=*/true));
  dropout = register_module("dropout", std::make_shared<Dropout>(c.classifier_dropout.value_or(c.hidden_dropout_prob)));
  classifier = register_module("classifier", std::make_shared<Linear>(c.hidden_size, c.num_labels));
  init_bert_weights(*classifier, c.initializer_range);
}

ModelOutput BertForSequenceClassification::forward(const Tensor& input_ids, const Tensor& attention_mask,
                                                   const Tensor& token_type_ids, const Tensor& labels) {
  Tensor pooled = bert->forward(input_ids, attention_mask, token_type_ids).pooler_output;
  Tensor logits = model_output(classifier->forward(dropout->forward(pooled)));
  ModelOutput out{Tensor(), logits};
  if (labels.defined()) {
    if (config.num_labels == 1) {
      out.loss = functional::mse_loss(logits.view({-1}), labels.to(logits.dtype()).view({-1}));
    } else {
      out.loss = cross_entropy(logits, labels.to(DType::i64).view({-1}));
    }
  }
  return out;
}

ModelOutput BertForSequenceClassification::forward(const Batch& b) {
  Tensor labels = b.contains("labels") ? b.at("labels") : b.get("label");
  return forward(b.at("input_ids"), b.get("attention_mask"), b.get("token_type_ids"), labels);
}

}  // namespace ember::nn
