#include "nn/models/config_fields.h"

#include <map>
#include <string>

#include "core/error.h"
#include "nn/io/json_config.h"

namespace ember::nn {

int64_t read_num_labels(const JsonConfig& j, int64_t fallback) {
  if (j.contains("id2label")) return int64_t(j.get<std::map<std::string, std::string>>("id2label").size());
  return j.get<int64_t>("num_labels", fallback);
}

void write_default_labels(JsonConfig& j, int64_t num_labels) {
  std::map<std::string, std::string> id2label;
  std::map<std::string, int64_t> label2id;
  for (int64_t i = 0; i < num_labels; ++i) {
    id2label[std::to_string(i)] = "LABEL_" + std::to_string(i);
    label2id["LABEL_" + std::to_string(i)] = i;
  }
  j.set("id2label", id2label);
  j.set("label2id", label2id);
}

void validate_read_config(const JsonConfig& j, const std::function<void()>& validate) {
  try {
    validate();
  } catch (const Error& e) {
    EMBER_FAIL(j.source(), ": ", e.what());
  }
}

}  // namespace ember::nn
