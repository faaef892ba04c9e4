// Datasets yield examples made of named tensors ("input_ids", "label", ...), like rows of a
// Hugging Face dataset; a Batch is the same map with a leading batch dim.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/batch.h"

namespace ember::data {

using Example = std::map<std::string, Tensor>;

using ember::Batch;

// get() may be called from several loader threads at once: implementations must be safe
// for concurrent reads.
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual Example get(int64_t index) const = 0;
};

// Rows of equally long tensors: example i holds row i of each named tensor.
class TensorDataset : public Dataset {
 public:
  explicit TensorDataset(std::map<std::string, Tensor> tensors);
  // Positional form: fields are named "0", "1", ...
  explicit TensorDataset(const std::vector<Tensor>& tensors);
  int64_t size() const override { return size_; }
  Example get(int64_t index) const override;

 private:
  std::map<std::string, Tensor> tensors_;
  int64_t size_ = 0;
};

// A view of a dataset through a list of indices (train/validation splits, shards).
class Subset : public Dataset {
 public:
  Subset(std::shared_ptr<const Dataset> base, std::vector<int64_t> indices);
  int64_t size() const override { return int64_t(indices_.size()); }
  Example get(int64_t index) const override;

 private:
  std::shared_ptr<const Dataset> base_;
  std::vector<int64_t> indices_;
};

}  // namespace ember::data
