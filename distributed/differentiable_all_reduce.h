// An all-reduce (sum) that autograd can differentiate, to any order: the gradient of every
// rank's input is the sum over the ranks of the gradients their outputs received, itself such an
// all-reduce. SyncBatchNorm's gradients under create_graph are built from it.
#pragma once
#include <memory>

#include "distributed/process_group.h"

namespace ember::distributed {

// The sum of `t` over the ranks of `pg` (a new tensor; t is left as it is). Every rank calls it
// with the same shape and dtype. When t requires grad (under grad mode) the result's backward
// all-reduces too, so every rank's backward must reach it: ranks that build the same graph do.
Tensor differentiable_all_reduce_sum(const Tensor& t, const std::shared_ptr<ProcessGroup>& pg);

}  // namespace ember::distributed
