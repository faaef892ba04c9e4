// The label fields Hugging Face writes in every classification model's config.json: num_labels
// is implied by id2label when present, and id2label/label2id name the labels LABEL_<i> by
// default. One definition for the model configs that read and write them.
#pragma once
#include <cstdint>

namespace ember::nn {

class JsonConfig;

// The number of labels: id2label's size if present, else "num_labels", else `fallback`.
int64_t read_num_labels(const JsonConfig& j, int64_t fallback);
// Writes id2label {"0": "LABEL_0", ...} and label2id {"LABEL_0": 0, ...}.
void write_default_labels(JsonConfig& j, int64_t num_labels);

}  // namespace ember::nn
