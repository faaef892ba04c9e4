// A block of memory shared by a tensor and all of its views.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "core/allocator.h"

namespace ember {

class Storage {
 public:
  // Owns nbytes from the device's allocator.
  Storage(size_t nbytes, Device device);
  // Owns nbytes from `allocator` (pinned host memory, say), whose memory lives on `device`.
  Storage(size_t nbytes, Device device, Allocator& allocator);
  // Wraps memory the caller owns; `deleter` (may be empty) runs when the last view dies.
  Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const {
    if (released_) [[unlikely]] throw_released();
    return data_;
  }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  Allocator* allocator() const { return allocator_; }  // null for wrapped memory

  // Gives the memory back to its allocator while the Storage, and so every tensor that views
  // it (autograd's saved tensors too), lives on: PyTorch's storage resize to 0. Sharded data
  // parallel drops a unit's gathered parameters this way between uses. Reading the memory
  // before restore_memory() is an ember::Error. Only for memory from an allocator.
  void release_memory();
  // Takes nbytes() bytes from the allocator again (contents undefined); the version counter
  // is unchanged, since the caller refills the same values.
  void restore_memory();
  bool memory_released() const { return released_; }

  // Counts the in-place writes into this memory (PyTorch's version counter). Every view shares
  // it, so autograd can tell when a tensor it saved for backward was changed afterwards.
  uint64_t version() const { return version_.load(std::memory_order_relaxed); }
  void bump_version() { version_.fetch_add(1, std::memory_order_relaxed); }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  Allocator* allocator_ = nullptr;  // null for wrapped memory
  std::function<void(void*)> deleter_;
  bool released_ = false;
  [[noreturn]] static void throw_released();
  std::atomic<uint64_t> version_{0};
};

}  // namespace ember
