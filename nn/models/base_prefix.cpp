#include "nn/models/base_prefix.h"

namespace ember::nn {

StateDict match_base_model_prefix(const std::map<std::string, Tensor>& weights, const Module& model,
                                  const std::string& prefix, const std::string& probe_key) {
  const StateDict own = model.state_dict();
  const bool model_prefixed = own.count(prefix + probe_key) > 0;
  bool file_prefixed = false;
  for (const auto& [k, v] : weights) file_prefixed |= k.rfind(prefix, 0) == 0;
  StateDict sd;
  for (const auto& [k, v] : weights) {
    std::string key = k;
    if (model_prefixed && !file_prefixed) key = prefix + k;
    if (!model_prefixed && file_prefixed && k.rfind(prefix, 0) == 0) key = k.substr(prefix.size());
    sd.emplace(key, v);
  }
  return sd;
}

}  // namespace ember::nn
