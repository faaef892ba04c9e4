// BertForMaskedLM's prediction head, nested as transformers nests it: cls.predictions.bias,
// cls.predictions.transform.{dense,LayerNorm}, and cls.predictions.decoder, whose weight is the
// word embeddings' (tied) and whose bias is cls.predictions.bias.
#pragma once
#include <memory>
#include <string>

#include "nn/layers/basic.h"
#include "nn/models/bert_config.h"

namespace ember::nn {

// LayerNorm(hidden_act(dense(x))), the bias added inside a GELU.
class BertPredictionHeadTransform : public Module {
 public:
  explicit BertPredictionHeadTransform(const BertConfig& c);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Linear> dense;
  std::shared_ptr<LayerNorm> layer_norm;  // registered as LayerNorm
  std::string act;
};

// The logits of the masked-LM head with the cross-entropy loss against the labels.
struct MlmHeadOutput {
  Tensor logits;
  Tensor loss;
};

// x W^T + b with weight and bias owned by other modules (tied), as transformers' decoder Linear.
class TiedLinear : public Module {
 public:
  TiedLinear(const Tensor& weight, const Tensor& bias);
  Tensor forward(const Tensor& x) override;
  // forward(x) and cross_entropy(logits as [rows, out], targets flattened, ignore_index -100)
  // as one op (linear_cross_entropy): its backward writes the logit gradient once and sums the
  // bias gradient in the same pass. The post hooks see the logits as forward's do; a hook that
  // replaces them gets the loss of its logits.
  MlmHeadOutput forward_with_loss(const Tensor& x, const Tensor& targets);
  Tensor weight, bias;
};

// decoder(transform(hidden)): [..., H] -> [..., vocab_size].
class BertLMPredictionHead : public Module {
 public:
  // decoder_weight [vocab_size, H]: the word embeddings, shared, not copied.
  BertLMPredictionHead(const BertConfig& c, const Tensor& decoder_weight);
  Tensor forward(const Tensor& hidden) override;
  MlmHeadOutput forward_with_loss(const Tensor& hidden, const Tensor& targets);  // see TiedLinear
  Tensor bias;  // [vocab_size], zeros; the decoder's bias too
  std::shared_ptr<BertPredictionHeadTransform> transform;
  std::shared_ptr<TiedLinear> decoder;
};

class BertOnlyMLMHead : public Module {
 public:
  BertOnlyMLMHead(const BertConfig& c, const Tensor& decoder_weight);
  Tensor forward(const Tensor& hidden) override;
  MlmHeadOutput forward_with_loss(const Tensor& hidden, const Tensor& targets);  // see TiedLinear
  std::shared_ptr<BertLMPredictionHead> predictions;
};

}  // namespace ember::nn
