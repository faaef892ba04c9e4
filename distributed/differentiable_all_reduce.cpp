#include "distributed/differentiable_all_reduce.h"

#include "autograd/node.h"
#include "core/error.h"
#include "core/native/copy.h"

namespace ember::distributed {

Tensor differentiable_all_reduce_sum(const Tensor& t, const std::shared_ptr<ProcessGroup>& pg) {
  EMBER_CHECK(pg != nullptr, "differentiable_all_reduce_sum: no process group");
  Tensor out = native::clone(t);  // the collective writes in place, into a contiguous tensor
  pg->allreduce(out)->wait();
  if (autograd::needs_grad({t})) {
    autograd::record(
        "AllReduceSumBackward", {t}, {out},
        [pg](const autograd::Tensors& g) -> autograd::Tensors { return {differentiable_all_reduce_sum(g[0], pg)}; },
        autograd::Backward::differentiable);
  }
  return out;
}

}  // namespace ember::distributed
