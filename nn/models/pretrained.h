// Hugging Face directory format for BERT: config.json + model.safetensors.
#pragma once
#include <memory>
#include <string>

#include "nn/models/bert.h"
#include "nn/models/pretrained_model.h"

namespace ember::nn {

// Writes config.json (`config` with architectures = {architecture}) and model.safetensors into
// `dir` (created if needed), as write_pretrained does (nn/models/pretrained_model.h): tied
// parameters stored once, under the first of their names, and the options honoured. The BERT
// models' own save_pretrained (nn::PretrainedModel) writes the same files.
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
