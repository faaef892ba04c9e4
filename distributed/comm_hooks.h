// Communication hooks for DistributedDataParallel, the twin of torch's register_comm_hook: a
// callable that receives one bucket of gradients and starts its reduction. The built-in hooks
// compress what goes over the wire to fp16 or bf16 (torch's fp16_compress_hook /
// bf16_compress_hook). docs/ddp_communication.md section 5.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "distributed/process_group.h"

namespace ember::distributed {

// One bucket as a hook sees it. `buffer` is flat and holds this rank's gradients (the sum of
// its micro-batches); when the work the hook returns has been waited on, `buffer` must hold the
// average over the ranks.
struct GradBucket {
  size_t index = 0;
  bool is_last = false;                   // the last bucket of the pass
  Tensor buffer;
  std::vector<std::string> parameter_names;
  ProcessGroup* process_group = nullptr;
  int64_t wire_bytes = 0;                 // what the hook sends, for CommStats (set by the hook)
};

// Starts the bucket's reduction; never null.
using CommHook = std::function<std::shared_ptr<Work>(GradBucket&)>;

// Accelerate's DDPCommunicationHookType.
enum class CommHookType { NONE, FP16, BF16 };
const char* comm_hook_name(CommHookType t);
CommHookType parse_comm_hook(const std::string& name);  // "no"/"none", "fp16", "bf16"

// The plain reduction: all-reduce of the f32 bucket, then divide by the world size.
std::shared_ptr<Work> allreduce_hook(GradBucket& bucket);
// Divides by the world size, casts to `wire` (f16 or bf16), all-reduces that, and casts the
// result back into the bucket when waited on: half the bytes, a rounding of each gradient.
CommHook compress_hook(DType wire);
// The hook a type names (NONE: empty).
CommHook comm_hook_for(CommHookType t);

// Work that runs `then` once, after `inner` finished, the first time it is waited on.
std::shared_ptr<Work> then_work(std::shared_ptr<Work> inner, std::function<void()> then);

}  // namespace ember::distributed
