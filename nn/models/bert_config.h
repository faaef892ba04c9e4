// BertConfig: the fields of Hugging Face's BertConfig, read from and written to config.json.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ember::nn {

struct BertConfig {
  int64_t vocab_size = 30522;
  int64_t hidden_size = 768;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;
  int64_t intermediate_size = 3072;
  std::string hidden_act = "gelu";  // "gelu" (erf), "gelu_new"/"gelu_pytorch_tanh" (tanh), "relu"
  double hidden_dropout_prob = 0.1;
  double attention_probs_dropout_prob = 0.1;
  int64_t max_position_embeddings = 512;
  int64_t type_vocab_size = 2;
  double initializer_range = 0.02;
  double layer_norm_eps = 1e-12;
  int64_t pad_token_id = 0;
  std::optional<double> classifier_dropout;
  int64_t num_labels = 2;
  std::vector<std::string> architectures;

  // Presets used by the examples and benchmarks.
  static BertConfig mini(int64_t vocab_size = 30522);  // 4 layers, hidden 256, 4 heads, FFN 1024
  static BertConfig tiny(int64_t vocab_size = 30522);  // 2 layers, hidden 128, 2 heads, FFN 512

  // Throws ember::Error naming the bad field: every size positive and at most 2^20, the heads
  // dividing hidden_size, about 2^40 parameters at most (bounds in bert_config.cpp).
  void validate() const;
  // The parameter count the sizes imply (embeddings, layers, pooler and the task heads), as a
  // double so that it cannot overflow.
  double parameter_count() const;
  static BertConfig from_json_file(const std::string& path);
  static BertConfig from_json_string(const std::string& text, const std::string& source = "<string>");
  std::string to_json_string() const;
  void save(const std::string& path) const;
};

}  // namespace ember::nn
