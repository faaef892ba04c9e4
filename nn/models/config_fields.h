// What every model config (BERT, GPT-2, ResNet) does alike with its config.json: the label
// fields Hugging Face writes for classification models (num_labels is implied by id2label when
// present; id2label/label2id name the labels LABEL_<i> by default), and the final validation,
// whose error names the file.
#pragma once
#include <cstdint>
#include <functional>

namespace ember::nn {

class JsonConfig;

// The number of labels: id2label's size if present, else "num_labels", else `fallback`.
int64_t read_num_labels(const JsonConfig& j, int64_t fallback);
// Writes id2label {"0": "LABEL_0", ...} and label2id {"LABEL_0": 0, ...}.
void write_default_labels(JsonConfig& j, int64_t num_labels);
// Runs a config's validate(); its ember::Error comes back prefixed with the JSON's source.
void validate_read_config(const JsonConfig& j, const std::function<void()>& validate);

}  // namespace ember::nn
