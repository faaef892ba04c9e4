// The caching device allocator. cudaMalloc and cudaFree synchronise the device and cost tens
// to hundreds of microseconds, so memory is taken from the driver in segments and managed by a
// BlockPool per device (kernels/cuda/block_pool.h): best-fit blocks, split and merged, reused in
// stream order. A tensor used on a second stream (an NCCL all-reduce on the process group's
// stream, a copy on a side stream) is marked with record_stream so that its memory is not
// handed out again before that stream's work finished.
#pragma once
#include <cuda_runtime_api.h>

#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/allocator.h"
#include "core/tensor.h"
#include "kernels/cuda/block_pool.h"

namespace ember::cuda {

class CudaCachingAllocator final : public Allocator {
 public:
  // Allocates on the current device, tagged with the current stream. Raises ember::Error
  // naming the size, the device and the memory held when the device is out of memory (after
  // returning every cached segment to the driver). Blocks are 512-byte multiples from
  // 256-byte aligned segments, so every tensor starts 16-byte aligned.
  void* allocate(size_t nbytes) override;
  // The same on `device` (what a Storage asks for): that device is made current for the call
  // and the previous one restored. Raises ember::Error for a device index that does not exist.
  void* allocate_on(Device device, size_t nbytes) override;
  void deallocate(void* ptr, size_t nbytes) noexcept override;  // runs in destructors
  Device device() const override { return Device::cuda(0); }

  // The block holding `ptr` (a pointer from allocate) is also used on `stream`.
  void record_stream(void* ptr, cudaStream_t stream);
  AllocatorStats stats(int device) const;
  int64_t segment_count(int device) const;
  void reset_peak(int device);
  // Returns every wholly free segment of every device to the driver.
  void empty_cache();

 private:
  struct DevicePool;
  DevicePool& pool_for(int device);  // requires mu_

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<DevicePool>> pools_;  // per device, created on first use
  std::unordered_map<void*, int> owner_;            // live pointer -> device
};

// The process-wide instance, registered for DeviceType::CUDA when the library loads. Creating
// it does not touch the driver; the first allocation does.
CudaCachingAllocator& cuda_allocator();

// Marks the memory of a CUDA tensor as used on `stream` (PyTorch's Tensor.record_stream). A
// tensor without memory (no elements) has nothing to mark.
void record_stream(const Tensor& t, cudaStream_t stream);

}  // namespace ember::cuda
