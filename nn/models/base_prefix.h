// transformers saves a task model's base model under a prefix ("transformer." for GPT-2,
// "resnet." for ResNet) that a checkpoint of the bare base model lacks; from_pretrained loads
// either into either. One renaming rule for every model that needs it.
#pragma once
#include <map>
#include <string>

#include "nn/module.h"

namespace ember::nn {

// `weights` renamed to the naming of `model`: the prefix added when the model has it (its state
// dict holds `prefix + probe_key`) and the file does not, removed in the opposite case.
StateDict match_base_model_prefix(const std::map<std::string, Tensor>& weights, const Module& model,
                                  const std::string& prefix, const std::string& probe_key);

}  // namespace ember::nn
