// The BERT model and random-batch training step shared by bench/bert_train.cpp and
// bench/ddp_scaling.cpp, so that both time exactly the same work.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "core/autocast.h"
#include "core/device_api.h"
#include "ember/ember.h"
#include "nn/models/bert.h"
#include "optim/sgd_adam.h"

namespace ember::bench {

// The model sizes a benchmark takes from its command line.
struct BertSizes {
  int64_t layers = 4, hidden = 256, heads = 4, ffn = 1024, vocab = 30522, seq = 128;
};

// Applies a named size preset (--config bert-mini|bert-tiny|bert-base); `program` prefixes the
// error. bert-base is Google's BERT-Base (vocab 30522, the default --vocab, is left as it is).
inline void apply_bert_preset(BertSizes& s, const std::string& name, const std::string& program) {
  EMBER_CHECK(name == "bert-mini" || name == "bert-tiny" || name == "bert-base", program, ": unknown --config ", name,
              " (bert-mini, bert-tiny or bert-base)");
  if (name == "bert-tiny") s.layers = 2, s.hidden = 128, s.heads = 2, s.ffn = 512;
  else if (name == "bert-base") s.layers = 12, s.hidden = 768, s.heads = 12, s.ffn = 3072;
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

// A BERT with the head for `task` ("mlm" or "cls"), in training mode, on `device`; exactly one
// head is set. The weights are initialised on the CPU and then moved, so a seed gives the same
// initial model on every device.
struct BertBenchModel {
  std::shared_ptr<nn::BertForMaskedLM> mlm;
  std::shared_ptr<nn::BertForSequenceClassification> cls;
  std::shared_ptr<nn::Module> module;
  // DDP steps the optimizer during backward (overlap_optimizer_step): train_step skips step().
  bool optimizer_stepped_in_backward = false;
  Device device = Device::cpu();

  BertBenchModel(const nn::BertConfig& cfg, const std::string& task, Device on = Device::cpu()) : device(on) {
    if (task == "mlm") module = mlm = std::make_shared<nn::BertForMaskedLM>(cfg);
    else module = cls = std::make_shared<nn::BertForSequenceClassification>(cfg);
    // In place: the tied decoder weight stays the word embedding; build the optimizer after this.
    if (device.is_cuda()) module->to(device);
    module->train();
  }

  // One optimiser step on a random batch of `batch` sequences; returns its wall time in ms.
  // The batch (token ids, an all-ones attention mask, the labels) is drawn on the CPU from the
  // default generator in the same order whatever the device, copied to the model's device, and
  // not timed. On CUDA the device is synchronised before each clock reading, so the time covers
  // all the queued work of the step. With mixed = true the forward and the loss run under bf16
  // autocast for the model's device type, as Accelerate's mixed_precision="bf16" does;
  // parameters and AdamW stay f32. `loss_out`, when given, receives the step's loss (read after
  // the clock stops).
  double train_step(optim::AdamW& opt, int64_t batch, int64_t seq, int64_t vocab, bool mixed = false,
                    double* loss_out = nullptr) {
    Tensor ids = randint(1, vocab, {batch, seq});
    Tensor mask = ones({batch, seq}, {DType::i64});  // no padding: every position attended
    Tensor labels;
    if (mlm) {
      // 15% of positions scored, the rest ignored, as MLM batches are
      Tensor scored = lt(rand({batch, seq}), 0.15);
      labels = where(scored, ids, full({batch, seq}, -100.0, {DType::i64}));
    } else {
      labels = randint(0, 2, {batch});
    }
    if (device.is_cuda()) {
      ids = ids.to(device);
      mask = mask.to(device);
      labels = labels.to(device);
      cuda_synchronize(device.index);
    }
    const auto t0 = std::chrono::steady_clock::now();
    Tensor loss;
    {
      AutocastGuard autocast(device.type, DType::bf16, mixed);
      loss = mlm ? mlm->forward(ids, mask, Tensor(), labels).loss : cls->forward(ids, mask, Tensor(), labels).loss;
    }
    loss.backward();
    if (!optimizer_stepped_in_backward) opt.step();
    opt.zero_grad();
    if (device.is_cuda()) cuda_synchronize(device.index);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (loss_out) *loss_out = loss.item<double>();
    return ms;
  }
};

}  // namespace ember::bench
