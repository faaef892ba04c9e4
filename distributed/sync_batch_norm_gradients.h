// SyncBatchNorm's gradients composed from differentiable ops: the history its fused backward's
// values get under create_graph (autograd/functions/composed_gradient.h), so its gradients can
// be differentiated again. The statistics and the gradient's sums span every rank's batch through
// differentiable all-reduces, whose own backward all-reduces: a second backward runs the matching
// collectives on every rank.
#pragma once
#include <memory>

#include "autograd/functions/normalization_gradients.h"
#include "distributed/process_group.h"

namespace ember::distributed {

// The forward's global statistics: per-channel mean and invstd [C], the values per channel over
// every rank, and eps.
struct SyncBatchStats {
  Tensor mean, invstd;
  double count;
  double eps;
};

// {dx, dweight, dbias} of sync_batch_norm for grad_out g on this rank's x; weight may be undefined.
// Collectives run only when the x gradient is wanted (then on every rank: x requires grad on all
// of them, as the first-order backward's all-reduce already needs): 4 all-reduces of C values, and
// as many in a backward through them. Without it the statistics are constants, those of the
// forward, and no rank all-reduces. weight and bias get this rank's own gradients.
autograd::Tensors sync_batch_norm_gradients(const Tensor& g, const Tensor& x, const Tensor& weight,
                                            const SyncBatchStats& stats, autograd::NormGradsWanted wanted,
                                            const std::shared_ptr<ProcessGroup>& pg);

}  // namespace ember::distributed
