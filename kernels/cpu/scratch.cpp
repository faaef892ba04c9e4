#include "kernels/cpu/scratch.h"

#include "core/error.h"
#include "kernels/cpu/aligned_buffer.h"

namespace ember::cpu {

void* thread_scratch_bytes(int slot, size_t bytes) {
  EMBER_CHECK(slot >= 0 && slot < kScratchSlots, "thread scratch: slot ", slot, " out of range [0, ", kScratchSlots,
              ")");
  thread_local AlignedBuffer slots[kScratchSlots];
  return slots[slot].get(bytes, "thread scratch");
}

}  // namespace ember::cpu
