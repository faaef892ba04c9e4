// The GradScaler's overflow verdict agreed across a process group: an inf/NaN gradient on any
// rank skips the step on every rank, so the replicas stay identical.
//
//   optim::GradScaler scaler({}, distributed::agree_on_overflow(group));
#pragma once
#include "distributed/process_group.h"
#include "optim/grad_scaler.h"

namespace ember::distributed {

// A max all-reduce of the flag over `group`, which must outlive the scaler. NCCL reduces the
// flag on the gradients' device, every other backend in host memory. With no group, or a
// group of one, the local verdict is the verdict.
optim::OverflowAgreement agree_on_overflow(ProcessGroup* group);

}  // namespace ember::distributed
