// The BERT model and random-batch training step shared by bench/bert_train.cpp and
// bench/ddp_scaling.cpp, so that both time exactly the same work.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "core/autocast.h"
#include "ember/ember.h"
#include "nn/models/bert.h"
#include "optim/sgd_adam.h"

namespace ember::bench {

// The model sizes a benchmark takes from its command line.
struct BertSizes {
  int64_t layers = 4, hidden = 256, heads = 4, ffn = 1024, vocab = 30522, seq = 128;
};

// Applies a named size preset (--config bert-mini|bert-tiny); `program` prefixes the error.
inline void apply_bert_preset(BertSizes& s, const std::string& name, const std::string& program) {
  EMBER_CHECK(name == "bert-mini" || name == "bert-tiny", program, ": unknown --config ", name);
  if (name == "bert-tiny") s.layers = 2, s.hidden = 128, s.heads = 2, s.ffn = 512;
  else s.layers = 4, s.hidden = 256, s.heads = 4, s.ffn = 1024;
}

inline nn::BertConfig bert_config(const BertSizes& s) {
  nn::BertConfig cfg;
  cfg.vocab_size = s.vocab;
  cfg.hidden_size = s.hidden;
  cfg.num_hidden_layers = s.layers;
  cfg.num_attention_heads = s.heads;
  cfg.intermediate_size = s.ffn;
  cfg.max_position_embeddings = std::max<int64_t>(512, s.seq);
  cfg.hidden_dropout_prob = cfg.attention_probs_dropout_prob = 0.1;
  return cfg;
}

// A BERT with the head for `task` ("mlm" or "cls"), in training mode; exactly one head is set.
struct BertBenchModel {
  std::shared_ptr<nn::BertForMaskedLM> mlm;
  std::shared_ptr<nn::BertForSequenceClassification> cls;
  std::shared_ptr<nn::Module> module;

  BertBenchModel(const nn::BertConfig& cfg, const std::string& task) {
    if (task == "mlm") module = mlm = std::make_shared<nn::BertForMaskedLM>(cfg);
    else module = cls = std::make_shared<nn::BertForSequenceClassification>(cfg);
    module->train();
  }

  // One optimiser step on a random batch of `batch` sequences; returns its wall time in ms
  // (drawing the token ids is not timed). With mixed = true the forward and the loss run under
  // bf16 autocast, as Accelerate's mixed_precision="bf16" does; parameters and AdamW stay f32.
  double train_step(optim::AdamW& opt, int64_t batch, int64_t seq, int64_t vocab, bool mixed = false) {
    Tensor ids = randint(1, vocab, {batch, seq});
    Tensor mask = ones({batch, seq}, {DType::i64});
    const auto t0 = std::chrono::steady_clock::now();
    Tensor loss;
    {
    AutocastGuard autocast(DeviceType::CPU, DType::bf16, mixed);
    if (mlm) {
      // 15% of positions scored, the rest ignored, as MLM batches are
      Tensor scored = lt(rand({batch, seq}), 0.15);
      Tensor labels = where(scored, ids, full({batch, seq}, -100.0, {DType::i64}));
      loss = mlm->forward(ids, mask, Tensor(), labels).loss;
    } else {
      Tensor labels = randint(0, 2, {batch});
      loss = cls->forward(ids, mask, Tensor(), labels).loss;
    }
    }
    loss.backward();
    opt.step();
    opt.zero_grad();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
};

}  // namespace ember::bench
