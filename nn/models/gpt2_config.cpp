#include "nn/models/gpt2_config.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "nn/io/json_config.h"
#include "nn/models/config_fields.h"

namespace ember::nn {

// The bounds of bert_config.cpp: every size at most 2^20, at most 2^40 parameters, so that no
// product of sizes overflows and an absurd config.json is refused before anything is allocated.
constexpr int64_t kMaxConfigSize = int64_t(1) << 20;
constexpr double kMaxConfigParameters = double(int64_t(1) << 40);

double GPT2Config::parameter_count() const {
  const double v = double(vocab_size), p = double(n_positions), h = double(n_embd), l = double(n_layer),
               i = double(n_inner.value_or(4 * std::min<int64_t>(n_embd, kMaxConfigSize)));
  const double layer = (3 * h * h + 3 * h) + (h * h + h) + 2 * h * i + i + h + 4 * h;  // attn, MLP, two LayerNorms
  return (v + p) * h + l * layer + 2 * h + (tie_word_embeddings ? 0.0 : v * h);
}

void GPT2Config::validate() const {
  auto size = [](const char* name, int64_t v) {
    EMBER_CHECK(v > 0, "GPT2Config: ", name, " must be positive, got ", v);
    EMBER_CHECK(v <= kMaxConfigSize, "GPT2Config: ", name, " = ", v, " exceeds the bound ", kMaxConfigSize,
                " (2^20)");
  };
  size("vocab_size", vocab_size);
  size("n_positions", n_positions);
  size("n_embd", n_embd);
  size("n_layer", n_layer);
  size("n_head", n_head);
  if (n_inner) size("n_inner", *n_inner);
  EMBER_CHECK(n_embd % n_head == 0, "GPT2Config: n_embd ", n_embd, " is not a multiple of n_head ", n_head);
  EMBER_CHECK(activation_function == "gelu_new" || activation_function == "gelu_pytorch_tanh" ||
                  activation_function == "gelu_fast" || activation_function == "gelu" ||
                  activation_function == "relu",
              "GPT2Config: unsupported activation_function '", activation_function,
              "' (gelu_new, gelu_pytorch_tanh, gelu_fast, gelu, relu)");
  auto prob = [](const char* name, double p) {
    EMBER_CHECK(p >= 0.0 && p <= 1.0, "GPT2Config: ", name, " must be in [0, 1], got ", p);
  };
  prob("resid_pdrop", resid_pdrop);
  prob("embd_pdrop", embd_pdrop);
  prob("attn_pdrop", attn_pdrop);
  EMBER_CHECK(layer_norm_epsilon > 0.0 && std::isfinite(layer_norm_epsilon),
              "GPT2Config: layer_norm_epsilon must be positive and finite, got ", layer_norm_epsilon);
  EMBER_CHECK(initializer_range >= 0.0 && std::isfinite(initializer_range),
              "GPT2Config: initializer_range must be non-negative and finite, got ", initializer_range);
  const double params = parameter_count();
  EMBER_CHECK(params <= kMaxConfigParameters, "GPT2Config: the sizes (vocab_size ", vocab_size, ", n_embd ", n_embd,
              ", n_layer ", n_layer, ", n_inner ", inner_size(), ", n_positions ", n_positions, ") imply about ", params,
              " parameters, more than the bound 2^40");
}

namespace {
GPT2Config from_config(const JsonConfig& j) {
  GPT2Config c;
  if (j.contains("model_type")) {
    const auto mt = j.get<std::string>("model_type");
    EMBER_CHECK(mt == "gpt2", j.source(), ": model_type is '", mt, "', expected 'gpt2'");
  }
  c.vocab_size = j.get<int64_t>("vocab_size", c.vocab_size);
  c.n_positions = j.get<int64_t>("n_positions", c.n_positions);
  c.n_embd = j.get<int64_t>("n_embd", c.n_embd);
  c.n_layer = j.get<int64_t>("n_layer", c.n_layer);
  c.n_head = j.get<int64_t>("n_head", c.n_head);
  c.n_inner = j.get_optional<int64_t>("n_inner");
  c.activation_function = j.get<std::string>("activation_function", c.activation_function);
  c.resid_pdrop = j.get<double>("resid_pdrop", c.resid_pdrop);
  c.embd_pdrop = j.get<double>("embd_pdrop", c.embd_pdrop);
  c.attn_pdrop = j.get<double>("attn_pdrop", c.attn_pdrop);
  c.layer_norm_epsilon = j.get<double>("layer_norm_epsilon", c.layer_norm_epsilon);
  c.initializer_range = j.get<double>("initializer_range", c.initializer_range);
  c.scale_attn_weights = j.get<bool>("scale_attn_weights", c.scale_attn_weights);
  c.scale_attn_by_inverse_layer_idx = j.get<bool>("scale_attn_by_inverse_layer_idx", c.scale_attn_by_inverse_layer_idx);
  c.reorder_and_upcast_attn = j.get<bool>("reorder_and_upcast_attn", c.reorder_and_upcast_attn);
  c.tie_word_embeddings = j.get<bool>("tie_word_embeddings", c.tie_word_embeddings);
  c.bos_token_id = j.contains("bos_token_id") ? j.get_optional<int64_t>("bos_token_id") : c.bos_token_id;
  c.eos_token_id = j.contains("eos_token_id") ? j.get_optional<int64_t>("eos_token_id") : c.eos_token_id;
  c.architectures = j.get<std::vector<std::string>>("architectures", {});
  validate_read_config(j, [&] { c.validate(); });
  return c;
}
}  // namespace

GPT2Config GPT2Config::from_json_file(const std::string& path) { return from_config(JsonConfig::load(path)); }

GPT2Config GPT2Config::from_json_string(const std::string& text, const std::string& source) {
  return from_config(JsonConfig::parse(text, source));
}

std::string GPT2Config::to_json_string() const {
  JsonConfig j;
  j.set("model_type", std::string("gpt2"));
  j.set("vocab_size", vocab_size);
  j.set("n_positions", n_positions);
  j.set("n_embd", n_embd);
  j.set("n_layer", n_layer);
  j.set("n_head", n_head);
  if (n_inner) {
    j.set("n_inner", *n_inner);
  } else {
    j.set_null("n_inner");
  }
  j.set("activation_function", activation_function);
  j.set("resid_pdrop", resid_pdrop);
  j.set("embd_pdrop", embd_pdrop);
  j.set("attn_pdrop", attn_pdrop);
  j.set("layer_norm_epsilon", layer_norm_epsilon);
  j.set("initializer_range", initializer_range);
  j.set("scale_attn_weights", scale_attn_weights);
  j.set("scale_attn_by_inverse_layer_idx", scale_attn_by_inverse_layer_idx);
  j.set("reorder_and_upcast_attn", reorder_and_upcast_attn);
  j.set("tie_word_embeddings", tie_word_embeddings);
  for (const auto& [name, id] : {std::pair{"bos_token_id", bos_token_id}, std::pair{"eos_token_id", eos_token_id}}) {
    if (id) {
      j.set(name, *id);
    } else {
      j.set_null(name);
    }
  }
  if (!architectures.empty()) j.set("architectures", architectures);
  return j.dump();
}

void GPT2Config::save(const std::string& path) const { JsonConfig::parse(to_json_string(), path).save(path); }

}  // namespace ember::nn
