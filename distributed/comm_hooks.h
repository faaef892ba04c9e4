// Communication hooks for DistributedDataParallel, the twin of torch's register_comm_hook: a
// callable that receives one bucket of gradients and starts its reduction. The built-in hooks
// compress what goes over the wire to fp16 or bf16 (torch's fp16_compress_hook /
// bf16_compress_hook), or send low-rank factors (PowerSGD, powersgd_hook.h).
// docs/ddp_communication.md section 5.
#pragma once
#include <cstdint>
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
  std::vector<Shape> parameter_shapes;    // in buffer order, each contiguous after the last
  ProcessGroup* process_group = nullptr;
  int64_t wire_bytes = 0;                 // what the hook sends, for CommStats (set by the hook)
};

// Starts the bucket's reduction; never null.
using CommHook = std::function<std::shared_ptr<Work>(GradBucket&)>;

// Accelerate's DDPCommunicationHookType.
enum class CommHookType { NONE, FP16, BF16, POWER_SGD };
const char* comm_hook_name(CommHookType t);
CommHookType parse_comm_hook(const std::string& name);  // "no"/"none", "fp16", "bf16", "power_sgd"

// PowerSGD's settings (powersgd_hook.h; torch's PowerSGDState).
struct PowerSGDOptions {
  int matrix_approximation_rank = 1;  // r
  int start_iter = 10;                // synchronised passes reduced plainly first
  // A matrix is compressed when n m >= min_compression_rate (n + m) r; 0 compresses every one.
  double min_compression_rate = 2.0;
  bool use_error_feedback = true;
  bool warm_start = true;             // keep each Q for the next pass (else draw a fresh one)
  uint64_t seed = 0;                  // Q's draws, the same on every rank
};


// The plain reduction: all-reduce of the f32 bucket, then divide by the world size.
std::shared_ptr<Work> allreduce_hook(GradBucket& bucket);
// Divides by the world size, casts to `wire` (f16 or bf16), all-reduces that, and casts the
// result back into the bucket when waited on: half the bytes, a rounding of each gradient.
CommHook compress_hook(DType wire);
// The hook a type names (NONE: empty); POWER_SGD takes `powersgd`.
CommHook comm_hook_for(CommHookType t, const PowerSGDOptions& powersgd = {});

// Work that runs `then` once, after `inner` finished, the first time it is waited on.
std::shared_ptr<Work> then_work(std::shared_ptr<Work> inner, std::function<void()> then);

}  // namespace ember::distributed
