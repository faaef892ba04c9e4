#include "nn/models/pretrained_model.h"

#include <algorithm>
#include <exception>
#include <filesystem>
#include <map>
#include <vector>

#include "core/error.h"
#include "core/storage.h"
#include "nn/io/safetensors.h"

namespace ember::nn {

namespace {
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

void write_pretrained(const Module& model, const std::function<JsonConfig()>& config, const std::string& dir,
                      const SavePretrainedOptions& options) {
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
        config().save(dir + "/config.json");
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

void PretrainedModel::gradient_checkpointing_enable() {
  EMBER_FAIL(type_name(), " does not support gradient checkpointing; wrap its blocks' forward in ember::checkpoint "
             "(autograd/checkpoint.h)");
}

void PretrainedModel::save_pretrained(const std::string& dir, const SavePretrainedOptions& options) const {
  write_pretrained(
      *this,
      [this] {
        JsonConfig config = config_json();
        config.set("architectures", std::vector<std::string>{architecture()});
        return config;
      },
      dir, options);
}

}  // namespace ember::nn
