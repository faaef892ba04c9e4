#include "nn/models/pretrained.h"

#include <cstdio>

#include "core/error.h"
#include "nn/io/json_config.h"
#include "nn/io/safetensors.h"

namespace ember::nn {

namespace {
bool tolerated_missing(const std::string& key) {
  // Tied to the word embeddings / prediction bias (transformers saves one copy), or a task head
  // that starts fresh when fine-tuning from a pretraining checkpoint (reported, as transformers
  // warns "newly initialized").
  return key == "cls.predictions.decoder.weight" || key == "cls.predictions.decoder.bias" ||
         key == "cls.predictions.bias" || key.rfind("classifier.", 0) == 0 || key.rfind("bert.pooler.", 0) == 0;
}
bool tolerated_unexpected(const std::string& key) {
  auto ends_with = [&](const std::string& s) {
    return key.size() >= s.size() && key.compare(key.size() - s.size(), s.size(), s) == 0;
  };
  // Buffers transformers may save, and heads of the other BERT task (pretraining checkpoints
  // carry cls.* and pooler weights that a classifier or an MLM model does not use).
  return ends_with("position_ids") || key.rfind("cls.", 0) == 0 || key.rfind("bert.pooler.", 0) == 0;
}
}  // namespace

void save_pretrained(const Module& model, const BertConfig& config, const std::string& dir,
                     const std::string& architecture, const SavePretrainedOptions& options) {
  write_pretrained(
      model,
      [&] {
        BertConfig c = config;
        c.architectures = {architecture};
        return JsonConfig::parse(c.to_json_string(), dir + "/config.json");
      },
      dir, options);
}

LoadReport load_pretrained_weights(Module& model, const std::string& dir) {
  std::map<std::string, Tensor> weights = load_safetensors(dir + "/model.safetensors");
  StateDict sd(weights.begin(), weights.end());
  LoadReport r = model.load_state_dict(sd, /*strict=*/false);
  LoadReport errors;
  for (const auto& k : r.missing_keys)
    if (!tolerated_missing(k)) errors.missing_keys.push_back(k);
  for (const auto& k : r.unexpected_keys)
    if (!tolerated_unexpected(k)) errors.unexpected_keys.push_back(k);
  EMBER_CHECK(errors.ok(), "from_pretrained('", dir, "'): the checkpoint does not match the model: ", errors.str());
  std::string fresh;
  for (const auto& k : r.missing_keys)
    if (k.rfind("classifier.", 0) == 0 || k.rfind("bert.pooler.", 0) == 0) fresh += (fresh.empty() ? "" : ", ") + k;
  if (!fresh.empty()) {
    // As transformers warns: these weights were not in the checkpoint and keep their fresh initialisation.
    std::fprintf(stderr, "from_pretrained('%s'): newly initialized (train them before use): %s\n", dir.c_str(),
                 fresh.c_str());
  }
  return r;
}

}  // namespace ember::nn
