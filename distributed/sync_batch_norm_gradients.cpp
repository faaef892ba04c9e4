#include "distributed/sync_batch_norm_gradients.h"

#include "distributed/differentiable_all_reduce.h"

namespace ember::distributed {

autograd::Tensors sync_batch_norm_gradients(const Tensor& g, const Tensor& x, const Tensor& weight,
                                            const SyncBatchStats& stats, autograd::NormGradsWanted wanted,
                                            const std::shared_ptr<ProcessGroup>& pg) {
  if (!wanted.dx) return autograd::batch_norm_eval_gradients(g, x, stats.mean, stats.invstd, weight, wanted);
  const autograd::WholeBatch every_rank{[pg](const Tensor& sums) { return differentiable_all_reduce_sum(sums, pg); },
                                        stats.count};
  return autograd::batch_norm_gradients(g, x, weight, stats.eps, wanted, every_rank);
}

}  // namespace ember::distributed
