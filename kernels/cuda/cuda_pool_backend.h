// The event half of a BlockPool backend through the CUDA runtime, shared by the device and
// the pinned-host allocators; each adds its own raw_alloc and raw_free.
#pragma once
#include "kernels/cuda/block_pool.h"

namespace ember::cuda {

class CudaEventPoolBackend : public PoolBackend {
 public:
  void* record_event(void* stream) override;
  // Done, or failed: a failed stream will never touch the memory again.
  bool event_done(void* event) override;
  void destroy_event(void* event) override;
};

}  // namespace ember::cuda
