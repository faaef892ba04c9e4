// A batch: tensors by field name ("input_ids", "attention_mask", "labels", ...). Data loaders
// produce it and models consume it, so it lives below both.
#pragma once
#include <map>
#include <string>

#include "core/tensor.h"

namespace ember {

struct Batch {
  std::map<std::string, Tensor> fields;
  Tensor& operator[](const std::string& key) { return fields[key]; }
  const Tensor& at(const std::string& key) const;
  Tensor get(const std::string& key) const;  // undefined when absent
  bool contains(const std::string& key) const { return fields.count(key) != 0; }
  int64_t size() const;  // leading dim of the first field (0 when empty)
  Batch to(Device device, bool non_blocking = false) const;
  Batch pin_memory() const;  // every field page-locked (see Tensor::pin_memory)
};

}  // namespace ember
