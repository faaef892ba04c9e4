#include "nn/models/bert_layers.h"

#include <limits>
#include <utility>

#include "autograd/checkpoint.h"
#include "core/autocast.h"
#include "core/factory.h"
#include "core/grad_mode.h"
#include "core/ops.h"

namespace ember::nn {

Tensor bert_dense_activation(const Linear& dense, const std::string& act, const Tensor& x) {
  if (act == "relu" || !dense.bias.defined()) {
    const Tensor y = linear(x, dense.weight, dense.bias);
    if (act == "relu") return relu(y);
    return gelu(y, act != "gelu");
  }
  // "gelu" is the exact form; gelu_new / gelu_pytorch_tanh the tanh one
  return bias_gelu(linear(x, dense.weight), dense.bias, act != "gelu");
}

BertEmbeddings::BertEmbeddings(const BertConfig& c) : Module("BertEmbeddings") {
  word_embeddings = register_module("word_embeddings", std::make_shared<Embedding>(c.vocab_size, c.hidden_size, c.pad_token_id));
  // A batch reads a few thousand of the vocabulary's rows: the backward leaves just those
  // (nn::Embedding::row_sparse_backward; .grad() still reads dense).
  word_embeddings->row_sparse_backward = true;
  position_embeddings = register_module("position_embeddings",
                                        std::make_shared<Embedding>(c.max_position_embeddings, c.hidden_size));
  token_type_embeddings = register_module("token_type_embeddings",
                                          std::make_shared<Embedding>(c.type_vocab_size, c.hidden_size));
  layer_norm = register_module("LayerNorm", std::make_shared<LayerNorm>(Shape{c.hidden_size}, c.layer_norm_eps));
  dropout = register_module("dropout", std::make_shared<Dropout>(c.hidden_dropout_prob));
}

Tensor BertEmbeddings::forward(const Tensor& input_ids, const Tensor& token_type_ids) {
  auto scope = enter_forward();
  EMBER_CHECK(input_ids.dim() == 2, "BertEmbeddings: input_ids must be [batch, length], got ", input_ids.shape());
  const int64_t len = input_ids.size(1);
  const int64_t max_len = position_embeddings->num_embeddings;
  EMBER_CHECK(len <= max_len, "BertEmbeddings: sequence length ", len, " exceeds max_position_embeddings ", max_len);
  Tensor positions = arange(len, {DType::i64, input_ids.device()});
  Tensor x = word_embeddings->forward(input_ids) + position_embeddings->forward(positions);
  Tensor types = token_type_ids.defined() ? token_type_ids : zeros(input_ids.shape(), {DType::i64, input_ids.device()});
  x = add_layer_norm(x, token_type_embeddings->forward(types), layer_norm->normalized_shape, layer_norm->weight,
                     layer_norm->bias, layer_norm->eps);
  return scope.exit(dropout->forward(x));
}

BertSelfAttention::BertSelfAttention(const BertConfig& c)
    : Module("BertSelfAttention"), num_heads(c.num_attention_heads), head_dim(c.hidden_size / c.num_attention_heads) {
  query = register_module("query", std::make_shared<Linear>(c.hidden_size, c.hidden_size));
  key = register_module("key", std::make_shared<Linear>(c.hidden_size, c.hidden_size));
  value = register_module("value", std::make_shared<Linear>(c.hidden_size, c.hidden_size));
  dropout = register_module("dropout", std::make_shared<Dropout>(c.attention_probs_dropout_prob));
}

Tensor BertSelfAttention::forward(const Tensor& hidden, const Tensor& additive_mask) {
  auto scope = enter_forward();
  // q, k and v from one product with the three weights stacked (cast once each under autocast);
  // the attention reads the heads in place and writes them merged: no per-head copies.
  auto stacked = [](const Linear& a, const Linear& b, const Linear& c, Tensor Linear::*p) {
    return cat({autocast::to_lower(a.*p), autocast::to_lower(b.*p), autocast::to_lower(c.*p)}, 0);
  };
  const Tensor qkv = linear(hidden, stacked(*query, *key, *value, &Linear::weight),
                            stacked(*query, *key, *value, &Linear::bias));
  return scope.exit(packed_self_attention(qkv, num_heads, additive_mask, dropout->p, dropout->is_training()));
}

BertResidualOutput::BertResidualOutput(std::string type_name, int64_t in_features, const BertConfig& c)
    : Module(std::move(type_name)) {
  dense = register_module("dense", std::make_shared<Linear>(in_features, c.hidden_size));
  layer_norm = register_module("LayerNorm", std::make_shared<LayerNorm>(Shape{c.hidden_size}, c.layer_norm_eps));
  dropout = register_module("dropout", std::make_shared<Dropout>(c.hidden_dropout_prob));
}

Tensor BertResidualOutput::forward(const Tensor& x, const Tensor& residual) {
  auto scope = enter_forward();
  return scope.exit(add_layer_norm(linear(x, dense->weight), residual, layer_norm->normalized_shape,
                                   layer_norm->weight, layer_norm->bias, layer_norm->eps, dropout->p,
                                   dropout->is_training(), dense->bias));
}

BertSelfOutput::BertSelfOutput(const BertConfig& c) : BertResidualOutput("BertSelfOutput", c.hidden_size, c) {}

BertOutput::BertOutput(const BertConfig& c) : BertResidualOutput("BertOutput", c.intermediate_size, c) {}

BertAttention::BertAttention(const BertConfig& c) : Module("BertAttention") {
  self = register_module("self", std::make_shared<BertSelfAttention>(c));
  output = register_module("output", std::make_shared<BertSelfOutput>(c));
}

Tensor BertAttention::forward(const Tensor& hidden, const Tensor& additive_mask) {
  auto scope = enter_forward();
  return scope.exit(output->forward(self->forward(hidden, additive_mask), hidden));
}

BertIntermediate::BertIntermediate(const BertConfig& c) : Module("BertIntermediate"), act(c.hidden_act) {
  dense = register_module("dense", std::make_shared<Linear>(c.hidden_size, c.intermediate_size));
}

Tensor BertIntermediate::forward(const Tensor& x) {
  auto scope = enter_forward();
  return scope.exit(bert_dense_activation(*dense, act, x));
}

BertLayer::BertLayer(const BertConfig& c) : Module("BertLayer") {
  attention = register_module("attention", std::make_shared<BertAttention>(c));
  intermediate = register_module("intermediate", std::make_shared<BertIntermediate>(c));
  output = register_module("output", std::make_shared<BertOutput>(c));
}

Tensor BertLayer::forward(const Tensor& hidden, const Tensor& additive_mask) {
  auto scope = enter_forward();
  Tensor a = attention->forward(hidden, additive_mask);
  return scope.exit(output->forward(intermediate->forward(a), a));
}

BertEncoder::BertEncoder(const BertConfig& c) : Module("BertEncoder") {
  layer = register_module("layer", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layer->push_back(std::make_shared<BertLayer>(c));
}

Tensor BertEncoder::forward(const Tensor& hidden, const Tensor& additive_mask) {
  auto scope = enter_forward();
  const bool checkpointed = gradient_checkpointing && is_training() && GradMode::is_enabled();
  Tensor h = hidden;
  for (size_t i = 0; i < layer->size(); ++i) {
    std::shared_ptr<BertLayer> l = layer->at<BertLayer>(i);
    if (checkpointed) {
      // By value: backward calls this again after forward has returned.
      h = checkpoint([l, additive_mask](const Tensor& x) { return l->forward(x, additive_mask); }, h);
    } else {
      h = l->forward(h, additive_mask);
    }
  }
  return scope.exit(h);
}

BertPooler::BertPooler(const BertConfig& c) : Module("BertPooler") {
  dense = register_module("dense", std::make_shared<Linear>(c.hidden_size, c.hidden_size));
}

Tensor BertPooler::forward(const Tensor& hidden) {
  auto scope = enter_forward();
  EMBER_CHECK(hidden.dim() == 3, "BertPooler: hidden must be [batch, length, hidden], got ", hidden.shape());
  return scope.exit(tanh(dense->forward(hidden.select(1, 0))));
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

}  // namespace ember::nn
