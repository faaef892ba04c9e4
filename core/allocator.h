// Memory allocators. The CPU allocator caches freed blocks by size class and hands them
// back on the next request of that class: a fresh 4 KiB page fault costs 12-16 us on the
// machines we train on, so returning memory to the OS every step is slow.
#pragma once
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/device.h"

namespace ember {

struct AllocatorStats {
  int64_t bytes_in_use = 0;       // requested bytes held by live tensors (rounded to size class)
  int64_t peak_bytes_in_use = 0;
  int64_t bytes_reserved = 0;     // bytes obtained from the system, in use or cached
  int64_t num_allocations = 0;    // calls to allocate
  int64_t num_cache_hits = 0;     // of which served from the cache
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes) = 0;
  // Memory on `device`, for allocators that serve several devices of their type (the CUDA one
  // serves every GPU); the others have one device and ignore it.
  virtual void* allocate_on(Device device, size_t nbytes) { return allocate(nbytes); }
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  virtual Device device() const = 0;
};

class CpuCachingAllocator final : public Allocator {
 public:
  static constexpr size_t kAlignment = 64;
  void* allocate(size_t nbytes) override;
  void deallocate(void* ptr, size_t nbytes) override;
  Device device() const override { return Device::cpu(); }
  AllocatorStats stats() const;
  void reset_peak();
  void empty_cache();  // returns every cached (unused) block to the system
  // Size classes: powers of two up to 1 MiB, then eighths of a power of two (<= 12.5% waste).
  static size_t round_size(size_t nbytes);

 private:
  mutable std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_blocks_;
  AllocatorStats stats_;
};

CpuCachingAllocator& cpu_allocator();
Allocator& allocator_for(Device d);  // CUDA registers its allocator when built in
void register_allocator(DeviceType type, Allocator* alloc);
// Page-locked host memory (registered by the CUDA backend; null without it). Its blocks are CPU
// memory the GPU's copy engines read and write directly, so host-device copies from them can
// run asynchronously.
Allocator* pinned_allocator();
void register_pinned_allocator(Allocator* alloc);

}  // namespace ember
