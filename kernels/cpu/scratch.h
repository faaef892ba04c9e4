// Per-thread scratch memory kept across calls: the tile buffers and partial sums of the kernels
// are allocated once per thread, not on every call (a large block freed back to malloc may be
// returned to the system, and the next call would fault its pages in again).
#pragma once
#include <cstddef>

namespace ember::cpu {

inline constexpr int kScratchSlots = 8;

// At least `bytes` bytes (64-byte aligned, contents unspecified) in slot `slot` of the calling
// thread's scratch, valid until the next call for that slot on this thread. Kernels give each
// live buffer its own slot; a kernel's caller and its parallel_for chunks (which may run on the
// calling thread too) use different slots.
void* thread_scratch_bytes(int slot, size_t bytes);

template <typename T>
T* thread_scratch(int slot, size_t count) {
  return static_cast<T*>(thread_scratch_bytes(slot, count * sizeof(T)));
}

}  // namespace ember::cpu
