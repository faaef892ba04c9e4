#include "nn/models/bert.h"

#include <utility>
#include <vector>

#include "core/factory.h"
#include "core/grad_mode.h"
#include "core/ops.h"
#include "nn/functional.h"
#include "nn/init.h"

namespace ember::nn {

JsonConfig BertPretrainedModel::config_json() const {
  return JsonConfig::parse(config.to_json_string(), "config.json");
}

BertModel::BertModel(const BertConfig& c, bool add_pooling_layer) : BertPretrainedModel("BertModel", c) {
  c.validate();
  embeddings = register_module("embeddings", std::make_shared<BertEmbeddings>(c));
  encoder = register_module("encoder", std::make_shared<BertEncoder>(c));
  if (add_pooling_layer) pooler = register_module("pooler", std::make_shared<BertPooler>(c));
  init_bert_weights(*this, c.initializer_range);
}

BertModelOutput BertModel::forward(const Tensor& input_ids, const Tensor& attention_mask, const Tensor& token_type_ids) {
  auto scope = enter_forward();
  Tensor h = embeddings->forward(input_ids, token_type_ids);
  Tensor mask;
  if (attention_mask.defined()) {
    EMBER_CHECK(attention_mask.shape() == input_ids.shape(), "BertModel: attention_mask ", attention_mask.shape(),
                " does not match input_ids ", input_ids.shape());
    mask = bert_additive_mask(attention_mask, h.dtype());
  }
  h = encoder->forward(h, mask);
  BertModelOutput out{h, Tensor()};
  if (pooler) out.pooler_output = pooler->forward(h);
  return scope.exit(std::move(out), &BertModelOutput::last_hidden_state, &BertModelOutput::pooler_output);
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

BertForMaskedLM::BertForMaskedLM(const BertConfig& c) : BertPretrainedModel("BertForMaskedLM", c) {
  bert = register_module("bert", std::make_shared<BertModel>(c, /*add_pooling_layer=*/false));
  cls = register_module("cls", std::make_shared<BertOnlyMLMHead>(c, bert->embeddings->word_embeddings->weight));
  const auto& predictions = *cls->predictions;
  transform_dense = predictions.transform->dense;
  transform_layer_norm = predictions.transform->layer_norm;
  decoder_weight = predictions.decoder->weight;
  decoder_bias = predictions.bias;
  init_bert_weights(*predictions.transform, c.initializer_range);
}

ModelOutput BertForMaskedLM::forward(const Tensor& input_ids, const Tensor& attention_mask,
                                     const Tensor& token_type_ids, const Tensor& labels) {
  auto scope = enter_forward();
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
  ModelOutput out;
  if (labels.defined()) {
    // The decoder and the loss as one op: one pass writes the logit gradient and its bias sums.
    MlmHeadOutput head = cls->forward_with_loss(h, targets);
    out = {head.loss, model_output(head.logits)};
  } else {
    out.logits = model_output(cls->forward(h));
  }
  return scope.exit(std::move(out), &ModelOutput::loss, &ModelOutput::logits);
}

ModelOutput BertForMaskedLM::forward(const Batch& b) {
  return forward(b.at("input_ids"), b.get("attention_mask"), b.get("token_type_ids"), b.get("labels"));
}

BertForSequenceClassification::BertForSequenceClassification(const BertConfig& c)
    : BertPretrainedModel("BertForSequenceClassification", c) {
  bert = register_module("bert", std::make_shared<BertModel>(c, /*add_pooling_layer=*/true));
  dropout = register_module("dropout", std::make_shared<Dropout>(c.classifier_dropout.value_or(c.hidden_dropout_prob)));
  classifier = register_module("classifier", std::make_shared<Linear>(c.hidden_size, c.num_labels));
  init_bert_weights(*classifier, c.initializer_range);
}

ModelOutput BertForSequenceClassification::forward(const Tensor& input_ids, const Tensor& attention_mask,
                                                   const Tensor& token_type_ids, const Tensor& labels) {
  auto scope = enter_forward();
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
  return scope.exit(std::move(out), &ModelOutput::loss, &ModelOutput::logits);
}

ModelOutput BertForSequenceClassification::forward(const Batch& b) {
  Tensor labels = b.contains("labels") ? b.at("labels") : b.get("label");
  return forward(b.at("input_ids"), b.get("attention_mask"), b.get("token_type_ids"), labels);
}

}  // namespace ember::nn
