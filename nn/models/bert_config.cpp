#include "nn/models/bert_config.h"

#include <cmath>

#include "nn/io/json_config.h"
#include "nn/models/config_fields.h"

namespace ember::nn {

BertConfig BertConfig::mini(int64_t vocab) {
  BertConfig c;
  c.vocab_size = vocab;
  c.hidden_size = 256;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.intermediate_size = 1024;
  return c;
}

BertConfig BertConfig::tiny(int64_t vocab) {
  BertConfig c;
  c.vocab_size = vocab;
  c.hidden_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.intermediate_size = 512;
  return c;
}

// Bounds on config.json, checked before a model allocates anything. Every size is at most
// kMaxConfigSize (2^20; the largest BERT checkpoints have vocabularies of about 2^18 and hidden
// sizes of 2^10), and the parameter count the sizes imply is at most kMaxConfigParameters
// (2^40 elements, 4 TiB in f32). Both keep every product of two sizes, and the parameter count,
// far from int64_t overflow. An absurd config.json is refused naming its file and the field,
// instead of failing in the allocator or worse.
constexpr int64_t kMaxConfigSize = int64_t(1) << 20;
constexpr double kMaxConfigParameters = double(int64_t(1) << 40);

double BertConfig::parameter_count() const {
  // In double: the estimate must not overflow for any sizes, and a bound check needs no
  // more precision.
  const double v = double(vocab_size), h = double(hidden_size), l = double(num_hidden_layers),
               i = double(intermediate_size), p = double(max_position_embeddings), t = double(type_vocab_size),
               n = double(num_labels);
  const double embeddings = (v + p + t) * h + 2 * h;
  const double layer = 4 * (h * h + h) + 2 * (h * i) + i + h + 4 * h;  // attention, FFN, two LayerNorms
  const double heads = (h * h + h) + (h * h + 3 * h + v) + (h * n + n);  // pooler, MLM head, classifier
  return embeddings + l * layer + heads;
}

void BertConfig::validate() const {
  auto size = [](const char* name, int64_t v) {
    EMBER_CHECK(v > 0, "BertConfig: ", name, " must be positive, got ", v);
    EMBER_CHECK(v <= kMaxConfigSize, "BertConfig: ", name, " = ", v, " exceeds the bound ", kMaxConfigSize,
                " (2^20)");
  };
  size("vocab_size", vocab_size);
  size("hidden_size", hidden_size);
  size("num_hidden_layers", num_hidden_layers);
  size("num_attention_heads", num_attention_heads);
  size("intermediate_size", intermediate_size);
  size("max_position_embeddings", max_position_embeddings);
  size("type_vocab_size", type_vocab_size);
  size("num_labels", num_labels);
  EMBER_CHECK(hidden_size % num_attention_heads == 0, "BertConfig: hidden_size ", hidden_size,
              " is not a multiple of num_attention_heads ", num_attention_heads);
  EMBER_CHECK(hidden_act == "gelu" || hidden_act == "gelu_new" || hidden_act == "gelu_pytorch_tanh" ||
                  hidden_act == "relu",
              "BertConfig: unsupported hidden_act '", hidden_act, "' (gelu, gelu_new, gelu_pytorch_tanh, relu)");
  auto prob = [](const char* name, double p) {
    EMBER_CHECK(p >= 0.0 && p <= 1.0, "BertConfig: ", name, " must be in [0, 1], got ", p);
  };
  prob("hidden_dropout_prob", hidden_dropout_prob);
  prob("attention_probs_dropout_prob", attention_probs_dropout_prob);
  if (classifier_dropout) prob("classifier_dropout", *classifier_dropout);
  EMBER_CHECK(pad_token_id >= 0 && pad_token_id < vocab_size, "BertConfig: pad_token_id ", pad_token_id,
              " out of range for vocab_size ", vocab_size);
  EMBER_CHECK(layer_norm_eps > 0.0 && std::isfinite(layer_norm_eps), "BertConfig: layer_norm_eps must be positive "
              "and finite, got ", layer_norm_eps);
  EMBER_CHECK(initializer_range >= 0.0 && std::isfinite(initializer_range), "BertConfig: initializer_range must "
              "be non-negative and finite, got ", initializer_range);
  const double params = parameter_count();
  EMBER_CHECK(params <= kMaxConfigParameters, "BertConfig: the sizes (vocab_size ", vocab_size, ", hidden_size ",
              hidden_size, ", num_hidden_layers ", num_hidden_layers, ", intermediate_size ", intermediate_size,
              ", max_position_embeddings ", max_position_embeddings, ") imply about ", params,
              " parameters, more than the bound 2^40");
}

namespace {
BertConfig from_config(const JsonConfig& j) {
  BertConfig c;
  if (j.contains("model_type")) {
    const auto mt = j.get<std::string>("model_type");
    EMBER_CHECK(mt == "bert", j.source(), ": model_type is '", mt, "', expected 'bert'");
  }
  c.vocab_size = j.get<int64_t>("vocab_size");
  c.hidden_size = j.get<int64_t>("hidden_size");
  c.num_hidden_layers = j.get<int64_t>("num_hidden_layers");
  c.num_attention_heads = j.get<int64_t>("num_attention_heads");
  c.intermediate_size = j.get<int64_t>("intermediate_size");
  c.hidden_act = j.get<std::string>("hidden_act", c.hidden_act);
  c.hidden_dropout_prob = j.get<double>("hidden_dropout_prob", c.hidden_dropout_prob);
  c.attention_probs_dropout_prob = j.get<double>("attention_probs_dropout_prob", c.attention_probs_dropout_prob);
  c.max_position_embeddings = j.get<int64_t>("max_position_embeddings", c.max_position_embeddings);
  c.type_vocab_size = j.get<int64_t>("type_vocab_size", c.type_vocab_size);
  c.initializer_range = j.get<double>("initializer_range", c.initializer_range);
  c.layer_norm_eps = j.get<double>("layer_norm_eps", c.layer_norm_eps);
  c.pad_token_id = j.get<int64_t>("pad_token_id", c.pad_token_id);
  c.classifier_dropout = j.get_optional<double>("classifier_dropout");
  c.num_labels = read_num_labels(j, c.num_labels);
  c.architectures = j.get<std::vector<std::string>>("architectures", {});
  const std::string pet = j.get<std::string>("position_embedding_type", "absolute");
  EMBER_CHECK(pet == "absolute", j.source(), ": position_embedding_type '", pet, "' is not supported (absolute only)");
  validate_read_config(j, [&] { c.validate(); });
  return c;
}
}  // namespace

BertConfig BertConfig::from_json_file(const std::string& path) { return from_config(JsonConfig::load(path)); }

BertConfig BertConfig::from_json_string(const std::string& text, const std::string& source) {
  return from_config(JsonConfig::parse(text, source));
}

std::string BertConfig::to_json_string() const {
  JsonConfig j;
  j.set("model_type", std::string("bert"));
  j.set("vocab_size", vocab_size);
  j.set("hidden_size", hidden_size);
  j.set("num_hidden_layers", num_hidden_layers);
  j.set("num_attention_heads", num_attention_heads);
  j.set("intermediate_size", intermediate_size);
  j.set("hidden_act", hidden_act);
  j.set("hidden_dropout_prob", hidden_dropout_prob);
  j.set("attention_probs_dropout_prob", attention_probs_dropout_prob);
  j.set("max_position_embeddings", max_position_embeddings);
  j.set("type_vocab_size", type_vocab_size);
  j.set("initializer_range", initializer_range);
  j.set("layer_norm_eps", layer_norm_eps);
  j.set("pad_token_id", pad_token_id);
  j.set("position_embedding_type", std::string("absolute"));
  if (classifier_dropout) {
    j.set("classifier_dropout", *classifier_dropout);
  } else {
    j.set_null("classifier_dropout");
  }
  write_default_labels(j, num_labels);
  if (!architectures.empty()) j.set("architectures", architectures);
  return j.dump();
}

void BertConfig::save(const std::string& path) const { JsonConfig::parse(to_json_string(), path).save(path); }

}  // namespace ember::nn
