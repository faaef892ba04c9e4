// nn::PretrainedModel: a module that saves itself in Hugging Face's directory format
// (config.json + model.safetensors), as transformers' PreTrainedModel does. The BERT models
// implement it; Accelerator::save_model saves any model that does through save_pretrained.
//
//   class MyModel : public nn::PretrainedModel {
//    public:
//     MyModel() : PretrainedModel("MyModel") { ... }
//     JsonConfig config_json() const override { return JsonConfig().set("width", width); }
//   };
#pragma once
#include <functional>
#include <string>

#include "nn/io/json_config.h"
#include "nn/models/save_pretrained_options.h"
#include "nn/module.h"

namespace ember::nn {

class PretrainedModel : public Module {
 public:
  using Module::Module;

  // The class transformers builds from config.json ("architectures": [architecture()]); by
  // default the module's type name.
  virtual std::string architecture() const { return type_name(); }
  // The model's configuration, the fields of config.json; save_pretrained sets "architectures".
  virtual JsonConfig config_json() const = 0;
  // config.json and model.safetensors (each tied tensor once) in `dir`, created if needed; see
  // SavePretrainedOptions for data-parallel jobs. Override to write more files.
  virtual void save_pretrained(const std::string& dir, const SavePretrainedOptions& options = {}) const;

  // transformers' gradient-checkpointing switch: while on, backward recomputes each block's
  // activations instead of keeping them. Models without blocks to recompute raise ember::Error.
  virtual bool supports_gradient_checkpointing() const { return false; }
  virtual void gradient_checkpointing_enable();
  virtual void gradient_checkpointing_disable() {}
  virtual bool is_gradient_checkpointing() const { return false; }
};

// The files save_pretrained writes, for any module: `config` (called only on the process that
// writes config.json) as config.json, then the weights as model.safetensors. The weights are
// the module's parameters and buffers, each tied tensor once, under its first name, as
// transformers writes them. A failure to write either file raises on the writing process after
// options.save_function has been called, so a collective save_function is reached everywhere.
void write_pretrained(const Module& model, const std::function<JsonConfig()>& config, const std::string& dir,
                      const SavePretrainedOptions& options = {});

}  // namespace ember::nn
