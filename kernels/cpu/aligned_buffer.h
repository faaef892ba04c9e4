// A 64-byte aligned block of memory that only grows: the per-thread scratch of kernels
// (kernels/cpu/scratch.h's slots, the GEMMs' packing buffers, oneDNN's primitive scratchpads)
// keeps one per use, so a steady run of calls allocates nothing and faults no fresh pages in.
#pragma once
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace ember::cpu {

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer() { std::free(data_); }

  // At least `bytes` bytes; the contents do not survive growing. A grown block is zero-filled
  // when `zero_when_grown` (for readers of padding that is never written); `what` names the use
  // in the out-of-memory error.
  void* get(size_t bytes, const char* what, bool zero_when_grown = false) {
    if (bytes <= size_) return data_;
    std::free(data_);
    data_ = nullptr;
    size_ = 0;
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    EMBER_CHECK(p != nullptr, what, ": cannot allocate ", rounded, " bytes of scratch memory");
    if (zero_when_grown) std::memset(p, 0, rounded);
    data_ = p;
    size_ = rounded;
    return data_;
  }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace ember::cpu
