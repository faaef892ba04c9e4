// The gather a strided or padded 1x1 convolution's forward (on AVX-512 machines) and weight
// gradient share: an image's input, at the positions the windows read, as rows of output positions
// (convolution_pointwise.h).
#pragma once
#include <cstdint>

#include "kernels/cpu/convolution_pointwise.h"

namespace ember::cpu {

// Channels [c0, c1) of image x [C, H, W] into xs [C, ld] (ld >= area):
// xs[c][oh * Wo + ow] = x[c][oh * sh - top][ow * sw - left], zero in the padding and from the area
// to ld. The input rows a few rows on are prefetched as it goes: waiting on each strided row's
// loads took most of the gather's time. `avx512`: a stride's runs moved by
// gather_every_other_avx512 (only where cpu_capability() is CpuCapability::Avx512), the same
// values.
void gather_position_rows(const PointwiseGeometry& g, const float* x, int64_t c0, int64_t c1, float* xs, int64_t ld,
                          bool avx512 = false);
// d[k] = s[2 k] for k < n, reading s[0, 2 n - 1) only, 16 lanes at a time: call only where
// cpu_capability() is CpuCapability::Avx512.
void gather_every_other_avx512(float* d, const float* s, int64_t n);

// Asks for share `part` of `parts` of the input rows the gather of image x reads (in its order) to
// come into L2: a kernel spreads the next image's shares over its work on this one, so that image's
// gather finds its rows there.
void prefetch_position_rows(const PointwiseGeometry& g, const float* x, int64_t part, int64_t parts);

}  // namespace ember::cpu
