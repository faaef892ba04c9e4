// GPT2Config: the fields of Hugging Face's GPT2Config, read from and written to config.json.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ember::nn {

struct GPT2Config {
  int64_t vocab_size = 50257;
  int64_t n_positions = 1024;
  int64_t n_embd = 768;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  std::optional<int64_t> n_inner;  // null: 4 * n_embd
  // "gelu_new", "gelu_pytorch_tanh", "gelu_fast" (tanh GELU), "gelu" (erf), "relu"
  std::string activation_function = "gelu_new";
  double resid_pdrop = 0.1;
  double embd_pdrop = 0.1;
  double attn_pdrop = 0.1;
  double layer_norm_epsilon = 1e-5;
  double initializer_range = 0.02;
  bool scale_attn_weights = true;
  bool scale_attn_by_inverse_layer_idx = false;
  bool reorder_and_upcast_attn = false;  // the softmax always runs in f32 here, so either value is fine
  bool tie_word_embeddings = true;
  std::optional<int64_t> bos_token_id = 50256;  // not checked against vocab_size, as in transformers
  std::optional<int64_t> eos_token_id = 50256;
  std::vector<std::string> architectures;

  int64_t inner_size() const { return n_inner.value_or(4 * n_embd); }

  // Throws ember::Error naming the bad field: every size positive and at most 2^20, n_head
  // dividing n_embd, about 2^40 parameters at most, a known activation, probabilities in [0, 1].
  void validate() const;
  // The parameter count the sizes imply, as a double so that it cannot overflow.
  double parameter_count() const;
  static GPT2Config from_json_file(const std::string& path);
  static GPT2Config from_json_string(const std::string& text, const std::string& source = "<string>");
  std::string to_json_string() const;
  void save(const std::string& path) const;
};

}  // namespace ember::nn
