// Turning a list of examples into a batch.
#pragma once
#include <functional>
#include <map>

#include "data/dataset.h"

namespace ember::data {

// Which batch is being built: lets a random collator (MLM masking) draw numbers that depend
// only on (seed, epoch, batch index), whatever worker thread builds it.
struct CollateContext {
  int64_t epoch = 0;
  int64_t batch_index = 0;
};

using CollateFn = std::function<Batch(const std::vector<Example>&, const CollateContext&)>;

// Stacks each field; every example must have the same fields and shapes.
Batch stack_collate(const std::vector<Example>& examples, const CollateContext& ctx = {});

// Pads 1-D fields to the longest in the batch (dynamic padding) and stacks them. Fields
// missing from pad_values pad with 0; 0-d fields are stacked as they are.
struct PadCollate {
  std::map<std::string, double> pad_values;  // e.g. {"labels", -100}
  int64_t pad_to_multiple_of = 1;
  Batch operator()(const std::vector<Example>& examples, const CollateContext& ctx = {}) const;
};

}  // namespace ember::data
