// What every data-parallel wrapper (DDP, sharded data parallel) does first: check that every
// rank built the same model, then start every rank from rank 0's values.
#pragma once
#include <vector>

#include "distributed/process_group.h"
#include "nn/module.h"

namespace ember::distributed {

// Raises ember::Error, prefixed with `who`, naming the first parameter or buffer whose name,
// shape, dtype or requires_grad differs between rank 0 and another rank. A collective.
void verify_same_model_on_all_ranks(const nn::Module& model, ProcessGroup& pg, const char* who);

// Copies rank 0's values of `tensors` into every rank's (strided tensors through a contiguous
// copy). A collective; no-op on one rank.
void broadcast_from_rank0(ProcessGroup& pg, const std::vector<Tensor>& tensors);

}  // namespace ember::distributed
