// The options of save_pretrained, as transformers' PreTrainedModel.save_pretrained takes them,
// so that a data-parallel job writes its model once:
//
//   acc.unwrap_model(m)->save_pretrained("out", {.is_main_process = acc.is_main_process(),
//                                                .save_function = acc.save_function()});
#pragma once
#include <functional>
#include <map>
#include <string>

#include "core/tensor.h"

namespace ember::nn {

struct SavePretrainedOptions {
  // Whether this process writes config.json (and, without a save_function, the weights).
  // Pass the Accelerator's is_main_process(): the other processes then write nothing.
  bool is_main_process = true;
  // Writes model.safetensors from the state dict. Like transformers, save_pretrained calls it
  // on every process (after the main process wrote config.json), so one that is a collective
  // (Accelerator::save_function(): the main process writes, a failure raises on every process,
  // and every process returns once the file is written) sees every process. Unset: the weights
  // are written directly, by the main process only.
  std::function<void(const std::map<std::string, Tensor>& state_dict, const std::string& path)> save_function =
      nullptr;
};

}  // namespace ember::nn
