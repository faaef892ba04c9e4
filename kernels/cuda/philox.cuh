// Philox4x32-10 on the device: the same words as Philox::draw in core/rng.cpp, so a seeded
// draw or a dropout mask is the same on either device. Dropout keeps element e of a draw from
// GeneratorState st when word e % 4 of philox(st.seed, st.offset + e / 4), shifted right by 8,
// is >= dropout_threshold(p) (kernels/cpu/dropout_mask.h documents the stream).
#pragma once
#include <cmath>
#include <cstdint>

#include "core/philox_rounds.h"

namespace ember::cuda {

// Philox4x32-10 with counter (hi = 0, lo = counter), as Philox::draw in core/rng.cpp.
__device__ __forceinline__ uint4 philox(uint64_t key, uint64_t counter) {
  uint32_t c[4] = {uint32_t(counter), uint32_t(counter >> 32), 0u, 0u};
  philox_rounds(c, key);
  return make_uint4(c[0], c[1], c[2], c[3]);
}

// ceil(p * 2^24): the smallest 24-bit value that keeps (the CPU's dropout_threshold).
inline uint32_t dropout_threshold(double p) { return uint32_t(std::ceil(p * 16777216.0)); }

// Whether element e of a dropout draw from (seed, offset) survives.
__device__ __forceinline__ bool dropout_keeps(uint64_t seed, uint64_t offset, uint64_t e, uint32_t threshold) {
  const uint4 r = philox(seed, offset + e / 4);
  const uint32_t w = (e & 3) == 0 ? r.x : (e & 3) == 1 ? r.y : (e & 3) == 2 ? r.z : r.w;
  return (w >> 8) >= threshold;
}

}  // namespace ember::cuda
