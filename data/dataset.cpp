#include "data/dataset.h"

namespace ember::data {

TensorDataset::TensorDataset(std::map<std::string, Tensor> tensors) : tensors_(std::move(tensors)) {
  EMBER_CHECK(!tensors_.empty(), "TensorDataset: needs at least one tensor");
  bool first = true;
  for (const auto& [name, t] : tensors_) {
    EMBER_CHECK(t.defined() && t.dim() >= 1, "TensorDataset: tensor '", name, "' must have at least one dim");
    if (first) size_ = t.size(0);
    EMBER_CHECK(t.size(0) == size_, "TensorDataset: tensor '", name, "' has ", t.size(0), " rows, expected ", size_);
    first = false;
  }
}

namespace {
std::map<std::string, Tensor> positional(const std::vector<Tensor>& v) {
  std::map<std::string, Tensor> m;
  for (size_t i = 0; i < v.size(); ++i) m[std::to_string(i)] = v[i];
  return m;
}
}  // namespace

TensorDataset::TensorDataset(const std::vector<Tensor>& tensors) : TensorDataset(positional(tensors)) {}

Example TensorDataset::get(int64_t index) const {
  EMBER_CHECK(index >= 0 && index < size_, "TensorDataset: index ", index, " out of range for ", size_, " examples");
  Example e;
  for (const auto& [name, t] : tensors_) e[name] = t.select(0, index);
  return e;
}

Subset::Subset(std::shared_ptr<const Dataset> base, std::vector<int64_t> indices)
    : base_(std::move(base)), indices_(std::move(indices)) {
  for (int64_t i : indices_)
    EMBER_CHECK(i >= 0 && i < base_->size(), "Subset: index ", i, " out of range for a dataset of ", base_->size());
}

Example Subset::get(int64_t index) const {
  EMBER_CHECK(index >= 0 && index < size(), "Subset: index ", index, " out of range for ", size(), " examples");
  return base_->get(indices_[size_t(index)]);
}

}  // namespace ember::data
