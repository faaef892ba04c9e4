// Questions about the GPU backend that user code may ask in every build. A build without
// CUDA, or a machine without a GPU, answers "no devices"; calls that need a device raise
// ember::Error saying why.
#pragma once
#include "core/allocator.h"

namespace ember {

bool cuda_is_available();
int cuda_device_count();
int cuda_current_device();
void cuda_set_device(int index);
// Waits for all work queued on the device; -1 means the current device.
void cuda_synchronize(int index = -1);
// The caching allocator's counters for a device (-1: current): bytes held by tensors, their
// peak, bytes reserved from the driver (in use or cached), allocations and cache hits.
AllocatorStats cuda_memory_stats(int index = -1);
void cuda_reset_peak_memory_stats(int index = -1);
// Gives every cached, unused device block back to the driver; a no-op without CUDA.
void cuda_empty_cache();

namespace detail {
// Filled in by the CUDA backend (kernels/cuda) when it is built in, so core includes no CUDA
// header. Calls arrive with a valid device index.
struct CudaHooks {
  int (*device_count)() = nullptr;
  int (*current_device)() = nullptr;
  void (*set_device)(int index) = nullptr;
  void (*synchronize)(int index) = nullptr;
  AllocatorStats (*memory_stats)(int index) = nullptr;
  void (*reset_peak_memory_stats)(int index) = nullptr;
  void (*empty_cache)() = nullptr;
};
void register_cuda_hooks(const CudaHooks& hooks);
}  // namespace detail

}  // namespace ember
