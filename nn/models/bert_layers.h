// BERT's encoder modules, named and nested as in Hugging Face transformers (BertEmbeddings,
// BertEncoder > BertLayer > BertAttention > BertSelfAttention, ...), so their parameters read
// embeddings.LayerNorm.weight, encoder.layer.N.attention.self.query.weight, pooler.dense.bias.
// Each forward runs the fused op its module owns: the residual add inside the LayerNorm, the
// bias inside the GELU, q/k/v as one product read by the packed attention.
#pragma once
#include <memory>
#include <string>

#include "nn/layers/basic.h"
#include "nn/layers/containers.h"
#include "nn/models/bert_config.h"

namespace ember::nn {

// hidden_act(dense(x)) for a BertConfig::hidden_act name; a GELU adds the bias inside the fused
// activation (one pass fewer). BertIntermediate and the masked-LM head transform share it.
Tensor bert_dense_activation(const Linear& dense, const std::string& hidden_act, const Tensor& x);

class BertEmbeddings : public Module {
 public:
  explicit BertEmbeddings(const BertConfig& c);
  // LayerNorm(word + position + token type), the last sum fused into the norm; token_type_ids
  // undefined means all zeros.
  Tensor forward(const Tensor& input_ids, const Tensor& token_type_ids);
  std::shared_ptr<Embedding> word_embeddings, position_embeddings, token_type_embeddings;
  std::shared_ptr<LayerNorm> layer_norm;  // registered as LayerNorm
  std::shared_ptr<Dropout> dropout;
};

class BertSelfAttention : public Module {
 public:
  explicit BertSelfAttention(const BertConfig& c);
  // hidden [B, L, H]; additive_mask [B, 1, 1, L] or undefined. Returns the heads merged, [B, L, H].
  Tensor forward(const Tensor& hidden, const Tensor& additive_mask);
  int64_t num_heads, head_dim;
  std::shared_ptr<Linear> query, key, value;
  std::shared_ptr<Dropout> dropout;
};

// LayerNorm(dropout(dense(x)) + residual) as one fused op after a bias-free product: the shape
// BertSelfOutput and BertOutput share.
class BertResidualOutput : public Module {
 public:
  Tensor forward(const Tensor& x, const Tensor& residual);
  std::shared_ptr<Linear> dense;
  std::shared_ptr<LayerNorm> layer_norm;  // registered as LayerNorm
  std::shared_ptr<Dropout> dropout;

 protected:
  BertResidualOutput(std::string type_name, int64_t in_features, const BertConfig& c);
};

// After the attention: dense [H -> H], then the residual LayerNorm.
class BertSelfOutput : public BertResidualOutput {
 public:
  explicit BertSelfOutput(const BertConfig& c);
};

class BertAttention : public Module {
 public:
  explicit BertAttention(const BertConfig& c);
  Tensor forward(const Tensor& hidden, const Tensor& additive_mask);
  std::shared_ptr<BertSelfAttention> self;
  std::shared_ptr<BertSelfOutput> output;
};

// hidden_act(dense(x)), dense [H -> intermediate_size].
class BertIntermediate : public Module {
 public:
  explicit BertIntermediate(const BertConfig& c);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Linear> dense;
  std::string act;
};

// After the feed-forward: dense [intermediate_size -> H], then the residual LayerNorm.
class BertOutput : public BertResidualOutput {
 public:
  explicit BertOutput(const BertConfig& c);
};

class BertLayer : public Module {
 public:
  explicit BertLayer(const BertConfig& c);
  Tensor forward(const Tensor& hidden, const Tensor& additive_mask);
  std::shared_ptr<BertAttention> attention;
  std::shared_ptr<BertIntermediate> intermediate;
  std::shared_ptr<BertOutput> output;
};

// num_hidden_layers BertLayers, applied in order.
class BertEncoder : public Module {
 public:
  explicit BertEncoder(const BertConfig& c);
  Tensor forward(const Tensor& hidden, const Tensor& additive_mask);
  std::shared_ptr<ModuleList> layer;  // of BertLayer
  // When set, training with grad on runs each layer under ember::checkpoint: its activations are
  // recomputed in backward instead of kept (the models' gradient_checkpointing_enable()).
  bool gradient_checkpointing = false;
};

// tanh(dense(hidden[:, 0])): the first token's state, [B, L, H] -> [B, H].
class BertPooler : public Module {
 public:
  explicit BertPooler(const BertConfig& c);
  Tensor forward(const Tensor& hidden) override;
  std::shared_ptr<Linear> dense;
};

// Converts a 1/0 attention mask [B, L] into the additive [B, 1, 1, L] mask BERT adds to the
// attention scores (0 where attended, the lowest finite value of `dtype` where padded).
Tensor bert_additive_mask(const Tensor& attention_mask, DType dtype);

}  // namespace ember::nn
