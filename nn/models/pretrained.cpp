#include "nn/models/pretrained.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>

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

// The tensors transformers writes: each tied tensor once.
std::map<std::string, Tensor> unique_tensors(const Module& model) {
  StateDict all = model.state_dict();
  std::map<std::string, Tensor> unique;
  std::vector<const Storage*> seen;
  // named_parameters lists tied tensors once, under their first name: keep exactly those.
  for (const auto& [name, t] : model.named_parameters()) {
    unique[name] = t.detach();
    seen.push_back(t.impl()->storage.get());
  }
  for (const auto& [name, t] : model.named_buffers()) unique[name] = t;
  for (const auto& [name, t] : all)
    if (!unique.count(name) &&
        std::find(seen.begin(), seen.end(), t.impl()->storage.get()) == seen.end())
      unique[name] = t;
  return unique;
}

}  // namespace

void save_pretrained(const Module& model, const BertConfig& config, const std::string& dir,
                     const std::string& architecture, const SavePretrainedOptions& options) {
  const bool writes = options.is_main_process;
  if (!writes && !options.save_function) return;  // another process writes
  const std::map<std::string, Tensor> weights = unique_tensors(model);
  const std::string weights_path = dir + "/model.safetensors";
  std::error_code ec;
  std::exception_ptr config_error;
  if (writes) {
    // The config goes first: a save_function that is a collective (Accelerator::save) then
    // returns on every process only after both files are written.
    std::filesystem::create_directories(dir, ec);
    if (!ec) {
      try {
        BertConfig c = config;
        c.architectures = {architecture};
        c.save(dir + "/config.json");
      } catch (...) {
        config_error = std::current_exception();
      }
    }
  }
  // Reached on every process, even after a failure here: a collective save_function must be.
  // Writing into a directory that could not be made then fails, naming the file, everywhere.
  if (options.save_function) options.save_function(weights, weights_path);
  if (!writes) return;
  EMBER_CHECK(!ec, "save_pretrained: cannot create directory '", dir, "': ", ec.message());
  if (config_error) std::rethrow_exception(config_error);
  if (!options.save_function) save_safetensors(weights_path, weights, {{"format", "pt"}});
}

void BertModel::save_pretrained(const std::string& dir, const SavePretrainedOptions& options) const {
  nn::save_pretrained(*this, config, dir, "BertModel", options);
}

void BertForMaskedLM::save_pretrained(const std::string& dir, const SavePretrainedOptions& options) const {
  nn::save_pretrained(*this, config, dir, "BertForMaskedLM", options);
}

void BertForSequenceClassification::save_pretrained(const std::string& dir,
                                                    const SavePretrainedOptions& options) const {
  nn::save_pretrained(*this, config, dir, "BertForSequenceClassification", options);
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
