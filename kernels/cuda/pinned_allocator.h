// Page-locked host memory for DataLoader(pin_memory) and Tensor::pin_memory. cudaHostAlloc
// pins pages with the driver and costs milliseconds, so segments are cached and cut into
// blocks by the same BlockPool as device memory. The host uses a block without stream order,
// so every block shares one pool key; a block that an asynchronous copy reads or writes is
// marked with record_use and is not handed out again until that copy finished.
#pragma once
#include <cuda_runtime_api.h>

#include <memory>
#include <mutex>

#include "core/allocator.h"
#include "kernels/cuda/block_pool.h"

namespace ember::cuda {

class PinnedHostAllocator final : public Allocator {
 public:
  PinnedHostAllocator();
  void* allocate(size_t nbytes) override;  // raises ember::Error naming the size when pinning fails
  void deallocate(void* ptr, size_t nbytes) noexcept override;
  Device device() const override { return Device::cpu(); }

  // The block that starts at `ptr` is read or written by work queued on `stream`.
  void record_use(void* ptr, cudaStream_t stream);
  AllocatorStats stats() const;
  void empty_cache();

 private:
  class Backend;
  mutable std::mutex mu_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<BlockPool> pool_;
};

PinnedHostAllocator& pinned_host_allocator();

}  // namespace ember::cuda
