// BERT with Hugging Face transformers' module tree and parameter names, so checkpoints move
// between the two: bert.embeddings.*, bert.encoder.layer.N.attention.self.query.weight, ...
// The encoder's modules are in nn/models/bert_layers.h, the masked-LM head's in
// nn/models/bert_mlm_head.h; this file has the models built from them.
#pragma once
#include <memory>
#include <string>
#include <utility>

#include "core/batch.h"
#include "nn/io/json_config.h"
#include "nn/layers/basic.h"
#include "nn/models/bert_config.h"
#include "nn/models/bert_layers.h"
#include "nn/models/bert_mlm_head.h"
#include "nn/models/pretrained_model.h"

namespace ember::nn {

// The BERT models' shared base, as transformers' BertPreTrainedModel: the config, written as
// config.json by save_pretrained (nn::PretrainedModel), with architectures = {type_name()}.
class BertPretrainedModel : public PretrainedModel {
 public:
  JsonConfig config_json() const override;
  BertConfig config;

  // As transformers': while training with grad on, each encoder layer runs under
  // ember::checkpoint (autograd/checkpoint.h), so backward recomputes its activations instead
  // of keeping them. The same loss and gradients (dropout included), less memory, more compute.
  bool supports_gradient_checkpointing() const override { return true; }
  void gradient_checkpointing_enable() override { bert_encoder().gradient_checkpointing = true; }
  void gradient_checkpointing_disable() override { bert_encoder().gradient_checkpointing = false; }
  bool is_gradient_checkpointing() const override { return bert_encoder().gradient_checkpointing; }

 protected:
  BertPretrainedModel(std::string type_name, const BertConfig& c) : PretrainedModel(std::move(type_name)), config(c) {}
  // The encoder whose layers gradient checkpointing wraps.
  virtual BertEncoder& bert_encoder() const = 0;
};

struct BertModelOutput {
  Tensor last_hidden_state;  // [B, L, H]
  Tensor pooler_output;      // [B, H], undefined without a pooler
};

class BertModel : public BertPretrainedModel {
 public:
  explicit BertModel(const BertConfig& c, bool add_pooling_layer = true);
  // attention_mask: 1 = attend, 0 = padding (any numeric dtype); token_type_ids optional.
  BertModelOutput forward(const Tensor& input_ids, const Tensor& attention_mask = Tensor(),
                          const Tensor& token_type_ids = Tensor());
  std::shared_ptr<BertEmbeddings> embeddings;
  std::shared_ptr<BertEncoder> encoder;
  std::shared_ptr<BertPooler> pooler;  // null without a pooling layer

 protected:
  BertEncoder& bert_encoder() const override { return *encoder; }
};

struct ModelOutput {
  Tensor loss;    // undefined without labels
  Tensor logits;
};

// Applies BERT's initialisation (normal(0, initializer_range), zero biases, unit LayerNorm).
void init_bert_weights(Module& m, double initializer_range);

class BertForMaskedLM : public BertPretrainedModel {
 public:
  explicit BertForMaskedLM(const BertConfig& c);
  // labels: -100 where no prediction is scored.
  ModelOutput forward(const Tensor& input_ids, const Tensor& attention_mask = Tensor(),
                      const Tensor& token_type_ids = Tensor(), const Tensor& labels = Tensor());
  ModelOutput forward(const Batch& batch);
  // When true and labels are given, the prediction head runs only on the scored positions
  // (labels != -100): the same loss for a fraction of the vocabulary-sized GEMM. logits then
  // hold one row per scored position, in order. Hugging Face computes every position.
  bool sparse_prediction = false;
  std::shared_ptr<BertModel> bert;
  std::shared_ptr<BertOnlyMLMHead> cls;
  // Shortcuts into cls.predictions (the same objects).
  std::shared_ptr<Linear> transform_dense;          // cls.predictions.transform.dense
  std::shared_ptr<LayerNorm> transform_layer_norm;  // cls.predictions.transform.LayerNorm
  Tensor decoder_weight;                            // tied to bert.embeddings.word_embeddings.weight
  Tensor decoder_bias;                              // cls.predictions.bias

 protected:
  BertEncoder& bert_encoder() const override { return *bert->encoder; }
};

class BertForSequenceClassification : public BertPretrainedModel {
 public:
  explicit BertForSequenceClassification(const BertConfig& c);
  ModelOutput forward(const Tensor& input_ids, const Tensor& attention_mask = Tensor(),
                      const Tensor& token_type_ids = Tensor(), const Tensor& labels = Tensor());
  // Reads input_ids, attention_mask, token_type_ids and labels (or label) from the batch.
  ModelOutput forward(const Batch& batch);
  std::shared_ptr<BertModel> bert;
  std::shared_ptr<Dropout> dropout;
  std::shared_ptr<Linear> classifier;

 protected:
  BertEncoder& bert_encoder() const override { return *bert->encoder; }
};

}  // namespace ember::nn
