// Hugging Face directory format: config.json + model.safetensors.
#pragma once
#include <string>

#include "nn/models/bert.h"

namespace ember::nn {

// Writes config.json and model.safetensors into `dir` (created if needed). Tied parameters are
// stored once, as transformers does, under the first of their names. With options (the BERT
// models' own save_pretrained takes them too): a process whose is_main_process is false writes
// nothing, and a save_function writes the weights (called on every process; see
// SavePretrainedOptions).
void save_pretrained(const Module& model, const BertConfig& config, const std::string& dir,
                     const std::string& architecture, const SavePretrainedOptions& options = {});

// Loads weights into an existing model. Keys that transformers drops or adds (tied decoder
// weights, position_ids buffers, a pooler or task head present on one side only) are tolerated
// and returned in the report; any other missing or unexpected key is an ember::Error listing them.
LoadReport load_pretrained_weights(Module& model, const std::string& dir);

template <typename M>
std::shared_ptr<M> from_pretrained(const std::string& dir) {
  BertConfig cfg = BertConfig::from_json_file(dir + "/config.json");
  auto model = std::make_shared<M>(cfg);
  load_pretrained_weights(*model, dir);
  return model;
}

}  // namespace ember::nn
