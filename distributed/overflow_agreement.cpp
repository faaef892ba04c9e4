#include "distributed/overflow_agreement.h"

#include "core/factory.h"
#include "core/tensor.h"

namespace ember::distributed {

optim::OverflowAgreement agree_on_overflow(ProcessGroup* group) {
  if (group == nullptr || group->size() <= 1) return {};
  return [group](bool found_inf_here, Device grads_device) {
    const Device where = group->backend_name() == "nccl" ? grads_device : Device::cpu();
    Tensor any = full({1}, found_inf_here ? 1.0 : 0.0, {DType::f32, where});
    group->allreduce(any, ReduceOp::Max)->wait();
    return any.item<double>() != 0.0;
  };
}

}  // namespace ember::distributed
