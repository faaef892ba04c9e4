// BERT with Hugging Face transformers' module tree and parameter names, so checkpoints move
// between the two: bert.embeddings.*, bert.encoder.layer.N.attention.self.query.weight, ...
#pragma once
#include "core/batch.h"
#include "nn/layers/basic.h"
#include "nn/layers/containers.h"
#include "nn/models/bert_config.h"
#include "nn/models/save_pretrained_options.h"

namespace ember::nn {

class BertEmbeddings : public Module {
 public:
  explicit BertEmbeddings(const BertConfig& c);
  Tensor forward(const Tensor& input_ids, const Tensor& token_type_ids);
  std::shared_ptr<Embedding> word_embeddings, position_embeddings, token_type_embeddings;
  std::shared_ptr<LayerNorm> layer_norm;
  std::shared_ptr<Dropout> dropout;
};

class BertSelfAttention : public Module {
 public:
  explicit BertSelfAttention(const BertConfig& c);
  // hidden [B, L, H]; additive_mask [B, 1, 1, L] or undefined.
  Tensor forward(const Tensor& hidden, const Tensor& additive_mask);
  int64_t num_heads, head_dim;
  std::shared_ptr<Linear> query, key, value;
  std::shared_ptr<Dropout> dropout;
};

// dense -> dropout -> LayerNorm(x + residual): BertSelfOutput and BertOutput share this shape.
class BertResidualOutput : public Module {
 public:
  BertResidualOutput(int64_t in, int64_t hidden, double dropout_p, double eps);
  Tensor forward(const Tensor& x, const Tensor& residual);
  std::shared_ptr<Linear> dense;
  std::shared_ptr<LayerNorm> layer_norm;
  std::shared_ptr<Dropout> dropout;
};

class BertAttention : public Module {
 public:
  explicit BertAttention(const BertConfig& c);
  Tensor forward(const Tensor& hidden, const Tensor& additive_mask);
  std::shared_ptr<BertSelfAttention> self;
  std::shared_ptr<BertResidualOutput> output;
};

class BertIntermediate : public Module {
 public:
  explicit BertIntermediate(const BertConfig& c);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Linear> dense;
  std::string act;
};

class BertLayer : public Module {
 public:
  explicit BertLayer(const BertConfig& c);
  Tensor forward(const Tensor& hidden, const Tensor& additive_mask);
  std::shared_ptr<BertAttention> attention;
  std::shared_ptr<BertIntermediate> intermediate;
  std::shared_ptr<BertResidualOutput> output;
};

struct BertModelOutput {
  Tensor last_hidden_state;  // [B, L, H]
  Tensor pooler_output;      // [B, H], undefined without a pooler
};

class BertModel : public Module {
 public:
  explicit BertModel(const BertConfig& c, bool add_pooling_layer = true);
  // attention_mask: 1 = attend, 0 = padding (any numeric dtype); token_type_ids optional.
  BertModelOutput forward(const Tensor& input_ids, const Tensor& attention_mask = Tensor(),
                          const Tensor& token_type_ids = Tensor());
  // config.json + model.safetensors in `dir`, loadable by transformers (nn/models/pretrained.h).
  void save_pretrained(const std::string& dir, const SavePretrainedOptions& options = {}) const;
  BertConfig config;
  std::shared_ptr<BertEmbeddings> embeddings;
  std::shared_ptr<ModuleList> encoder_layers;  // registered as encoder.layer
  std::shared_ptr<Linear> pooler_dense;        // registered as pooler.dense
};

struct ModelOutput {
  Tensor loss;    // undefined without labels
  Tensor logits;
};

// Applies BERT's initialisation (normal(0, initializer_range), zero biases, unit LayerNorm).
void init_bert_weights(Module& m, double initializer_range);

class BertForMaskedLM : public Module {
 public:
  explicit BertForMaskedLM(const BertConfig& c);
  // labels: -100 where no prediction is scored.
  ModelOutput forward(const Tensor& input_ids, const Tensor& attention_mask = Tensor(),
                      const Tensor& token_type_ids = Tensor(), const Tensor& labels = Tensor());
  ModelOutput forward(const Batch& batch);
  // config.json + model.safetensors in `dir`, loadable by transformers (nn/models/pretrained.h).
  void save_pretrained(const std::string& dir, const SavePretrainedOptions& options = {}) const;
  BertConfig config;
  // When true and labels are given, the prediction head runs only on the scored positions
  // (labels != -100): the same loss for a fraction of the vocabulary-sized GEMM. logits then
  // hold one row per scored position, in order. Hugging Face computes every position.
  bool sparse_prediction = false;
  std::shared_ptr<BertModel> bert;
  std::shared_ptr<Linear> transform_dense;          // cls.predictions.transform.dense
  std::shared_ptr<LayerNorm> transform_layer_norm;  // cls.predictions.transform.LayerNorm
  Tensor decoder_weight;                            // tied to bert.embeddings.word_embeddings.weight
  Tensor decoder_bias;                              // cls.predictions.bias
};

class BertForSequenceClassification : public Module {
 public:
  explicit BertForSequenceClassification(const BertConfig& c);
  ModelOutput forward(const Tensor& input_ids, const Tensor& attention_mask = Tensor(),
                      const Tensor& token_type_ids = Tensor(), const Tensor& labels = Tensor());
  // Reads input_ids, attention_mask, token_type_ids and labels (or label) from the batch.
  ModelOutput forward(const Batch& batch);
  // config.json + model.safetensors in `dir`, loadable by transformers (nn/models/pretrained.h).
  void save_pretrained(const std::string& dir, const SavePretrainedOptions& options = {}) const;
  BertConfig config;
  std::shared_ptr<BertModel> bert;
  std::shared_ptr<Dropout> dropout;
  std::shared_ptr<Linear> classifier;
};

// Converts a 1/0 attention mask [B, L] into the additive [B, 1, 1, L] mask BERT adds to the
// attention scores (0 where attended, the lowest finite value of `dtype` where padded).
Tensor bert_additive_mask(const Tensor& attention_mask, DType dtype);

}  // namespace ember::nn
