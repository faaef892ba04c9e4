// The caching device allocator. cudaMalloc and cudaFree synchronise the device and cost tens
// to hundreds of microseconds, so freed blocks are kept in pools and handed back to the next
// request of the same size class on the same device and stream. Reuse needs no event or
// synchronisation: work queued on one stream runs in order, so a kernel that reads a reused
// block always runs after every earlier kernel that used it.
#pragma once
#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/allocator.h"

namespace ember::cuda {

class CudaCachingAllocator final : public Allocator {
 public:
  // Blocks come from cudaMalloc (256-byte aligned) and sizes are multiples of 512 bytes, so
  // every tensor starts 16-byte aligned and vector loads need no peeling at offset 0.
  static constexpr size_t kMinBlock = 512;

  // Allocates on the current device, tagged with the current stream. Raises ember::Error
  // when no device is usable or the device is out of memory (after emptying the cache).
  void* allocate(size_t nbytes) override;
  void deallocate(void* ptr, size_t nbytes) override;  // never throws: runs in destructors
  Device device() const override { return Device::cuda(0); }

  AllocatorStats stats(int device) const;
  void reset_peak(int device);
  // Returns every cached (unused) block of every device to the driver.
  void empty_cache();
  // Size classes: powers of two from 512 B up to 1 MiB, then eighths of a power of two.
  static size_t round_size(size_t nbytes);

 private:
  struct Block {
    size_t size;
    int device;
    cudaStream_t stream;
  };
  using PoolKey = std::tuple<int, cudaStream_t, size_t>;  // device, stream, size class

  AllocatorStats& stats_for(int device);  // requires mu_
  void release_cached(int device);        // cudaFree the device's pooled blocks; requires mu_

  mutable std::mutex mu_;
  std::map<PoolKey, std::vector<void*>> pools_;
  std::unordered_map<void*, Block> live_;
  std::vector<AllocatorStats> stats_;  // per device
};

// The process-wide instance, registered for DeviceType::CUDA when the library loads. Creating
// it does not touch the driver; the first allocation does.
CudaCachingAllocator& cuda_allocator();

}  // namespace ember::cuda
