// The dropout mask stream, shared by the dropout kernel and the fused kernels that drop
// elements on the way (kernels/cpu/fused_*.cpp), so that all of them keep the same elements for
// the same generator state.
//
// Element e of an op that drew GeneratorState st keeps when the Philox uniform of word e % 4 of
// Philox::draw(st.seed, 0, st.offset + e / 4) is >= p: every counter feeds four elements.
// Philox::to_uniform(w) = (w >> 8) / 2^24 exactly, so the test is the integer compare
// (w >> 8) >= dropout_threshold(p).
#pragma once
#include <cstdint>

#include "core/rng.h"

namespace ember::cpu {

// ceil(p * 2^24): the smallest 24-bit value that keeps.
uint32_t dropout_threshold(double p);

// keep[i] = 1 when element first + i survives, else 0, for i < n (bytes usable as bool).
void dropout_keep_mask(const GeneratorState& st, uint32_t threshold, int64_t first, int64_t n, uint8_t* keep);

// out[i] = x[i] * (keep[i] ? scale : 0) for i < n: a product, so NaN and inf stay visible.
// out may alias x.
void apply_keep_mask(float* out, const float* x, const uint8_t* keep, float scale, int64_t n);

// The keep bytes of whole Philox blocks first .. first + count - 1 of `key` (out[4 b + w] for
// word w of block first + b), 16 blocks at a time with AVX-512; returns how many blocks it did
// (a multiple of 16, the rest left to the caller). Call only when cpu_capability() is
// CpuCapability::Avx512.
int64_t dropout_keep_blocks_avx512(uint64_t key, uint64_t first, int64_t count, uint32_t threshold, uint8_t* out);

// Dropout of the elements of whole Philox blocks first .. first + count - 1 (element 4 b + w of
// x, out and keep for word w of block first + b): keep as dropout_keep_blocks_avx512 writes it
// and out[i] = x[i] * (keep[i] ? scale : 0), as apply_keep_mask, 16 blocks at a time; returns
// how many blocks it did. stream: out and keep written with non-temporal stores where both are
// 64-byte aligned (kernels/cpu/streamed_output.h), fenced before returning. AVX-512 only, as above.
int64_t dropout_blocks_avx512(uint64_t key, uint64_t first, int64_t count, uint32_t threshold, float scale,
                              const float* x, float* out, uint8_t* keep, bool stream);

}  // namespace ember::cpu
