// The smallest BERT the save, load and Accelerator tests build: one layer, hidden 16, two heads,
// FFN 32, 16 positions. Small enough that a test saves and reloads it in milliseconds.
#pragma once
#include <cstdint>

#include "nn/models/bert_config.h"

namespace ember::testing {

inline nn::BertConfig one_layer_bert_config(int64_t vocab_size) {
  nn::BertConfig cfg = nn::BertConfig::tiny(vocab_size);
  cfg.num_hidden_layers = 1;
  cfg.hidden_size = 16;
  cfg.num_attention_heads = 2;
  cfg.intermediate_size = 32;
  cfg.max_position_embeddings = 16;
  return cfg;
}

}  // namespace ember::testing
