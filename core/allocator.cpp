#include "core/allocator.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "core/error.h"

// Under AddressSanitizer, cached blocks and the slack past each request are poisoned, so reads
// or writes past a tensor's bytes or into a freed tensor are still reported despite the cache.
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define EMBER_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define EMBER_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define EMBER_POISON(p, n) ((void)(p), (void)(n))
#define EMBER_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__)
#include <malloc.h>
#endif

namespace ember {

namespace {
// The libraries Ember calls (oneDNN's f32 GEMM above all) allocate and free their workspace with
// malloc on every call. With glibc's default, self-adjusting thresholds the freed top of a heap
// is returned to the system as soon as it passes 128 KiB, unless some earlier large free
// happened to raise the threshold, and the next call faults every page in again: about 15
// minor faults per GEMM, hundreds per training step. Keep freed malloc memory for reuse, as
// the caching allocator does for tensors, unless the user tuned glibc through its own
// environment variables.
const bool malloc_tuned = [] {
#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__)
  if (!std::getenv("MALLOC_TRIM_THRESHOLD_")) mallopt(M_TRIM_THRESHOLD, 256 << 20);
  if (!std::getenv("MALLOC_MMAP_THRESHOLD_")) mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's maximum
#endif
  return true;
}();
}  // namespace

size_t CpuCachingAllocator::round_size(size_t n) {
  if (n <= 64) return 64;
  if (n <= (size_t(1) << 20)) {
    size_t p = 64;
    while (p < n) p <<= 1;
    return p;
  }
  size_t p = size_t(1) << 20;
  while (p <= n / 2) p <<= 1;  // p <= n < 2p, without computing 2p past the top of size_t
  const size_t step = p / 8;
  return n / step * step + (n % step ? step : 0);
}

size_t CpuCachingAllocator::class_index(size_t rounded) {
  const int k = 63 - __builtin_clzll(uint64_t(rounded));  // rounded = 2^k * (8 + j) / 8
  if (rounded <= (size_t(1) << 20)) return size_t(k - 6);
  const size_t j = (rounded - (size_t(1) << k)) / (size_t(1) << (k - 3));
  return 14 + size_t(k - 20) * 8 + j;
}

size_t CpuCachingAllocator::class_size(size_t index) {
  if (index <= 14) return size_t(64) << index;
  const size_t k = 20 + (index - 14) / 8, j = (index - 14) % 8;
  return (size_t(1) << k) + j * (size_t(1) << (k - 3));
}

namespace {

void count_in_use(AllocatorStats& stats, size_t size, size_t nbytes) {
  stats.bytes_in_use += int64_t(size);
  stats.peak_bytes_in_use = std::max(stats.peak_bytes_in_use, stats.bytes_in_use);
  stats.requested_bytes_in_use += int64_t(nbytes);
  stats.peak_requested_bytes = std::max(stats.peak_requested_bytes, stats.requested_bytes_in_use);
}

}  // namespace

void* CpuCachingAllocator::allocate(size_t nbytes) {
  EMBER_CHECK(nbytes <= kMaxRequest, "CPU allocator: out of memory allocating ", nbytes, " bytes (",
              double(nbytes) / (1 << 20), " MiB)");
  const size_t size = round_size(nbytes);
  const size_t cls = class_index(size);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.num_allocations;
    if (FreeBlock* b = free_lists_[cls]) {
      EMBER_UNPOISON(b, sizeof(FreeBlock));
      free_lists_[cls] = b->next;
      ++stats_.num_cache_hits;
      count_in_use(stats_, size, nbytes);
      EMBER_POISON(b, size);
      EMBER_UNPOISON(b, nbytes);
      return b;
    }
    if (memory_limit_ > 0 && stats_.bytes_reserved + int64_t(size) > memory_limit_) {
      release_cache_locked();
      EMBER_CHECK(stats_.bytes_reserved + int64_t(size) <= memory_limit_, "CPU allocator: out of memory allocating ",
                  nbytes, " bytes (", double(nbytes) / (1 << 20), " MiB): the memory limit is ", memory_limit_,
                  " bytes (set_memory_limit or EMBER_CPU_MEMORY_LIMIT) and ", stats_.bytes_reserved,
                  " bytes are in use");
      // Reserve under the lock, so that two threads cannot both pass the limit.
      stats_.bytes_reserved += int64_t(size);
    } else {
      stats_.bytes_reserved += int64_t(size);
    }
  }
  void* p = std::aligned_alloc(kAlignment, size);
  if (!p) {
    empty_cache();
    p = std::aligned_alloc(kAlignment, size);
  }
  if (p == nullptr) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.bytes_reserved -= int64_t(size);
  }
  EMBER_CHECK(p != nullptr, "CPU allocator: out of memory allocating ", nbytes, " bytes (",
              double(nbytes) / (1 << 20), " MiB)");
  EMBER_POISON(static_cast<char*>(p) + nbytes, size - nbytes);
  std::lock_guard<std::mutex> lock(mu_);
  count_in_use(stats_, size, nbytes);
  return p;
}

void CpuCachingAllocator::deallocate(void* ptr, size_t nbytes) noexcept {
  if (!ptr) return;
  const size_t size = round_size(nbytes);
  const size_t cls = class_index(size);
  EMBER_UNPOISON(ptr, sizeof(FreeBlock));
  auto* b = static_cast<FreeBlock*>(ptr);
  std::lock_guard<std::mutex> lock(mu_);
  b->next = free_lists_[cls];
  free_lists_[cls] = b;
  EMBER_POISON(ptr, size);
  stats_.bytes_in_use -= int64_t(size);
  stats_.requested_bytes_in_use -= int64_t(nbytes);
}

AllocatorStats CpuCachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CpuCachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_bytes_in_use = stats_.bytes_in_use;
  stats_.peak_requested_bytes = stats_.requested_bytes_in_use;
}

void CpuCachingAllocator::set_memory_limit(int64_t bytes) {
  EMBER_CHECK(bytes >= 0, "CPU allocator: the memory limit must be >= 0 bytes (0: none), got ", bytes);
  std::lock_guard<std::mutex> lock(mu_);
  memory_limit_ = bytes;
}

int64_t CpuCachingAllocator::memory_limit() const {
  std::lock_guard<std::mutex> lock(mu_);
  return memory_limit_;
}

int64_t CpuCachingAllocator::parse_memory_limit(const char* text) {
  const std::string value = text ? text : "";
  size_t digits = 0;
  while (digits < value.size() && value[digits] >= '0' && value[digits] <= '9') ++digits;
  const std::string suffix = value.substr(digits);
  const int shift = suffix.empty() ? 0 : suffix == "K" ? 10 : suffix == "M" ? 20 : suffix == "G" ? 30 : -1;
  EMBER_CHECK(digits > 0 && digits <= 15 && shift >= 0, "EMBER_CPU_MEMORY_LIMIT: expected bytes, or a number with "
              "K, M or G (e.g. 4096, 512M, 2G), got '", value, "'");
  return std::stoll(value.substr(0, digits)) << shift;
}

void CpuCachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  release_cache_locked();
}

void CpuCachingAllocator::release_cache_locked() {
  for (size_t cls = 0; cls < kNumClasses; ++cls) {
    const size_t size = class_size(cls);
    while (FreeBlock* b = free_lists_[cls]) {
      EMBER_UNPOISON(b, sizeof(FreeBlock));
      free_lists_[cls] = b->next;
      EMBER_UNPOISON(b, size);
      std::free(b);
      stats_.bytes_reserved -= int64_t(size);
    }
  }
}

CpuCachingAllocator& cpu_allocator() {
  // Leaked on purpose: tensors in static storage may be freed after main returns.
  static auto* alloc = [] {
    const char* limit = std::getenv("EMBER_CPU_MEMORY_LIMIT");
    const int64_t bytes = limit && *limit ? CpuCachingAllocator::parse_memory_limit(limit) : 0;
    auto* a = new CpuCachingAllocator();
    a->set_memory_limit(bytes);
    return a;
  }();
  return *alloc;
}

namespace {
Allocator*& cuda_slot() {
  static Allocator* slot = nullptr;
  return slot;
}
Allocator*& pinned_slot() {
  static Allocator* slot = nullptr;
  return slot;
}
}  // namespace

void register_allocator(DeviceType type, Allocator* alloc) {
  if (type == DeviceType::CUDA) cuda_slot() = alloc;
}

Allocator* pinned_allocator() { return pinned_slot(); }
void register_pinned_allocator(Allocator* alloc) { pinned_slot() = alloc; }

Allocator& allocator_for(Device d) {
  if (d.is_cpu()) return cpu_allocator();
  EMBER_CHECK(cuda_slot() != nullptr, "device ", d,
              ": Ember was built without CUDA support or no CUDA allocator is available");
  return *cuda_slot();
}

}  // namespace ember
