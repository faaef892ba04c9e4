// The layout of sharded data parallel: which parameters form each wrapped unit, and where each
// lies in the unit's flat buffer. A unit's parameters sit in model registration order in one
// flat buffer padded with zeros to a multiple of the world size N; rank r owns the contiguous
// slice [r*S, (r+1)*S) with S = padded/N, so ragged worlds (3 ranks) need no special case.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "distributed/fsdp_options.h"
#include "nn/module.h"

namespace ember::distributed {

struct FlatParamEntry {
  std::string name;  // the parameter's first name in the model (named_parameters())
  Tensor param;
  int64_t offset = 0;  // first element within the unit's flat buffer
  int64_t numel = 0;
  int64_t model_index = 0;  // position in model.named_parameters()
};

struct UnitLayout {
  std::string name;  // the wrapped module's path; "" for the root unit
  std::vector<FlatParamEntry> params;
  int64_t numel = 0;         // sum of the parameters' element counts
  int64_t padded_numel = 0;  // numel rounded up to a multiple of the world size (at least N)
  int64_t shard_numel = 0;   // padded_numel / N

  // The part of params[i] inside the flat range [begin, end): its first element within the
  // parameter and its length (0 when they do not meet).
  std::pair<int64_t, int64_t> overlap(size_t i, int64_t begin, int64_t end) const;
  std::string display_name() const { return name.empty() ? "(root)" : name; }
};

// The wrapped module paths the policy picks, parents before children. NO_WRAP picks none.
std::vector<std::string> wrapped_module_paths(nn::Module& model, const FSDPOptions& options);

// Every parameter that requires grad goes to the deepest wrapped module holding it; a parameter
// held by two modules (tied weights) goes to the deepest unit holding both, and what no wrapped
// module holds to the root unit. Units are ordered by their first parameter (units without
// parameters are dropped). Raises ember::Error for a world size below 1 or a parameter that is
// not f32.
std::vector<UnitLayout> plan_units(nn::Module& model, const FSDPOptions& options, int world_size);

}  // namespace ember::distributed
