#include "data/collate.h"

#include <algorithm>

#include "core/factory.h"
#include "core/grad_mode.h"
#include "core/ops.h"

namespace ember::data {
namespace {
void check_fields(const std::vector<Example>& examples, const char* who) {
  EMBER_CHECK(!examples.empty(), who, ": empty batch");
  for (size_t i = 1; i < examples.size(); ++i) {
    EMBER_CHECK(examples[i].size() == examples[0].size(), who, ": example ", i, " has ", examples[i].size(),
                " fields, example 0 has ", examples[0].size());
    for (const auto& [k, v] : examples[0])
      EMBER_CHECK(examples[i].count(k), who, ": example ", i, " lacks field '", k, "'");
  }
}
}  // namespace

Batch stack_collate(const std::vector<Example>& examples, const CollateContext&) {
  NoGradGuard ng;
  check_fields(examples, "stack_collate");
  Batch b;
  for (const auto& [key, first] : examples[0]) {
    std::vector<Tensor> items;
    items.reserve(examples.size());
    for (const auto& e : examples) {
      const Tensor& t = e.at(key);
      EMBER_CHECK(t.shape() == first.shape(), "stack_collate: field '", key, "' has shape ", t.shape(),
                  " in one example and ", first.shape(), " in another; use PadCollate for variable lengths");
      items.push_back(t);
    }
    b.fields[key] = stack(items, 0);
  }
  return b;
}

Batch PadCollate::operator()(const std::vector<Example>& examples, const CollateContext&) const {
  NoGradGuard ng;
  check_fields(examples, "PadCollate");
  Batch b;
  const int64_t n = int64_t(examples.size());
  for (const auto& [key, first] : examples[0]) {
    if (first.dim() == 0) {
      std::vector<Tensor> items;
      for (const auto& e : examples) items.push_back(e.at(key));
      b.fields[key] = stack(items, 0);
      continue;
    }
    EMBER_CHECK(first.dim() == 1, "PadCollate: field '", key, "' must be 0-d or 1-d, got shape ", first.shape());
    int64_t len = 0;
    for (const auto& e : examples) {
      const Tensor& t = e.at(key);
      EMBER_CHECK(t.dim() == 1 && t.dtype() == first.dtype(), "PadCollate: field '", key,
                  "' must be 1-d of one dtype in every example");
      len = std::max(len, t.size(0));
    }
    if (pad_to_multiple_of > 1) len = (len + pad_to_multiple_of - 1) / pad_to_multiple_of * pad_to_multiple_of;
    auto pv = pad_values.find(key);
    Tensor out = full({n, len}, pv == pad_values.end() ? 0.0 : pv->second, {first.dtype()});
    for (int64_t i = 0; i < n; ++i) {
      const Tensor& t = examples[size_t(i)].at(key);
      if (t.size(0) > 0) out.select(0, i).narrow(0, 0, t.size(0)).copy_(t);
    }
    b.fields[key] = out;
  }
  return b;
}

}  // namespace ember::data
