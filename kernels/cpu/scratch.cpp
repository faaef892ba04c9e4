#include "kernels/cpu/scratch.h"

#include <cstdlib>

#include "core/error.h"

namespace ember::cpu {
namespace {

struct ThreadScratch {
  void* data[kScratchSlots] = {};
  size_t size[kScratchSlots] = {};
  ~ThreadScratch() {
    for (void* p : data) std::free(p);
  }
};

}  // namespace

void* thread_scratch_bytes(int slot, size_t bytes) {
  EMBER_CHECK(slot >= 0 && slot < kScratchSlots, "thread scratch: slot ", slot, " out of range [0, ", kScratchSlots,
              ")");
  thread_local ThreadScratch scratch;
  if (scratch.size[slot] < bytes) {
    std::free(scratch.data[slot]);
    scratch.data[slot] = nullptr;
    scratch.size[slot] = 0;
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    EMBER_CHECK(p != nullptr, "thread scratch: cannot allocate ", rounded, " bytes");
    scratch.data[slot] = p;
    scratch.size[slot] = rounded;
  }
  return scratch.data[slot];
}

}  // namespace ember::cpu
