// How the input gradient of a stride-2 1x1 convolution (convolution_pointwise_input.cpp) writes a
// channel's dX rows on AVX-512: the rows as one stretch of the channel's plane, whole 64-byte lines
// written past the cache, where the AVX2 loop writes half lines (eight floats per streaming store).
#pragma once
#include <cstdint>

#include "kernels/cpu/convolution_pointwise.h"

namespace ember::cpu {

// Whether stream_stride2_rows_avx512 can write dX rows [ih0, ih1) of every channel: column stride
// 2 without left padding, rows of whole 8-float halves, and the stretch's ends on 64-byte lines of
// a 64-byte aligned dX (a channel's plane a whole number of lines).
bool stride2_rows_stream_whole_lines(const PointwiseGeometry& g, const float* dx, int64_t ih0, int64_t ih1);
// dX rows [ih0, ih1) of one channel (plane: the channel's [H, W]) from its tile row `s` (the output
// rows from oh0 on, g.out_w apart): an input row some output row oh reads holds s[(oh - oh0) *
// out_w + ow] + add at column 2 ow for ow < end_inside, every other float 0 + add; the other rows
// hold 0 + add. The values of the AVX2 loop, bit for bit. Call only where
// stride2_rows_stream_whole_lines holds and cpu_capability() is CpuCapability::Avx512; the caller
// fences (_mm_sfence) before another thread reads the rows.
void stream_stride2_rows_avx512(const PointwiseGeometry& g, const float* s, int64_t oh0, int64_t ih0, int64_t ih1,
                                float add, float* plane);

}  // namespace ember::cpu
