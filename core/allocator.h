// Memory allocators. The CPU allocator caches freed blocks by size class and hands them
// back on the next request of that class: a fresh 4 KiB page fault costs 12-16 us on the
// machines we train on, so returning memory to the OS every step is slow.
//
// Freeing never allocates and never throws (deallocate is noexcept): it runs in destructors,
// also while an out-of-memory error unwinds, where a throw would abort the process.
#pragma once
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "core/device.h"

namespace ember {

struct AllocatorStats {
  int64_t bytes_in_use = 0;       // requested bytes held by live tensors (rounded to size class)
  int64_t peak_bytes_in_use = 0;
  int64_t requested_bytes_in_use = 0;  // the same, unrounded: what the tensors asked for
  int64_t peak_requested_bytes = 0;
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
  // Must not allocate or throw: it runs in destructors, also during stack unwinding.
  virtual void deallocate(void* ptr, size_t nbytes) noexcept = 0;
  virtual Device device() const = 0;
};

class CpuCachingAllocator final : public Allocator {
 public:
  static constexpr size_t kAlignment = 64;
  // Raises ember::Error naming the size when the system has no memory left for it (after
  // returning every cached block).
  void* allocate(size_t nbytes) override;
  void deallocate(void* ptr, size_t nbytes) noexcept override;
  Device device() const override { return Device::cpu(); }
  AllocatorStats stats() const;
  void reset_peak();  // both peaks restart from what is in use now
  // A cap on the bytes obtained from the system (in use or cached), as PyTorch's per-process
  // memory fraction: a request that would pass it, after returning every cached block, raises
  // ember::Error ("out of memory", the request, the limit and what is in use) and changes
  // nothing. 0 means no limit. The variable EMBER_CPU_MEMORY_LIMIT sets it at start-up.
  void set_memory_limit(int64_t bytes);
  int64_t memory_limit() const;
  // EMBER_CPU_MEMORY_LIMIT's value: bytes, or a number with K, M or G (powers of 1024);
  // ember::Error naming the variable for anything else.
  static int64_t parse_memory_limit(const char* text);
  void empty_cache();  // returns every cached (unused) block to the system
  // Size classes: powers of two up to 1 MiB, then eighths of a power of two (<= 12.5% waste).
  static size_t round_size(size_t nbytes);
  // Requests above this are refused as out of memory (no system has that much), which keeps
  // every size class below 2^63.
  static constexpr size_t kMaxRequest = size_t(1) << 62;

 private:
  // A cached block's first bytes link it to the next cached block of its class, so caching a
  // freed block needs no memory of its own. Every class is a multiple of 64 bytes.
  struct FreeBlock {
    FreeBlock* next;
  };
  // Classes 64 B .. 1 MiB (15 powers of two), then eight per power of two up to kMaxRequest.
  static constexpr size_t kNumClasses = 15 + 42 * 8;
  static size_t class_index(size_t rounded);  // of a round_size result
  static size_t class_size(size_t index);

  void release_cache_locked();  // empty_cache with mu_ held

  mutable std::mutex mu_;
  FreeBlock* free_lists_[kNumClasses] = {};
  AllocatorStats stats_;
  int64_t memory_limit_ = 0;
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
