// The plan and image copies the direct kernel's AVX2 and AVX-512 register blocks share
// (convolution_direct.h): internal to convolution_direct.cpp and convolution_direct_avx512.cpp.
#pragma once
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/native/convolution.h"

namespace ember::cpu {

// Two layouts of the image the taps read. Rows whose width is a multiple of the lanes take one
// zero-padded copy per channel, read row by row. Other widths would leave lanes idle at every row's
// end (4 of 32 on a 28-wide row), so they take kW copies per channel, copy kw shifted by kernel
// column kw and cut to the output's width: an output position and its reads in every copy are then
// the same flat index, and the plane is cut into chunks of the lanes whatever rows they span. The
// copies cost C * kW small row moves per image, which a 5x5 layer with few output channels feels
// (LeNet's 24-wide rows measured 81 GFLOP/s padded, 62 shifted).
struct DirectGeometry {
  int64_t channels, height, width, out_channels, kernel_h, kernel_w, out_h, out_w;
  native::Conv2dParams p;
  // Positions per vector (8 on AVX2, 16 on AVX-512) and output channels per register block; `flat`:
  // the shifted copies whatever the width (the weight gradient reads each tap's positions as one
  // run).
  int64_t lanes, channel_block;
  bool flat = false;
  int64_t taps() const { return channels * kernel_h * kernel_w; }
  int64_t area() const { return out_h * out_w; }
  bool shifted() const { return flat || out_w % lanes != 0; }
  // Copies per channel and their width: kW of Wo (shifted) or one of every column a window reads
  // (padded).
  int64_t copies() const { return shifted() ? kernel_w : 1; }
  int64_t copy_w() const { return shifted() ? out_w : out_w + (kernel_w - 1) * p.dilation[1]; }
  // Rows of a copy: every input row some output row reads, padding included.
  int64_t copy_rows() const { return out_h + (kernel_h - 1) * p.dilation[0]; }
  int64_t copy_size() const { return copy_rows() * copy_w(); }
};

// The tap-independent parts of one call: where each tap reads in the copies (relative to the
// chunk's read position), the weights regrouped per block of output channels, the chunks.
struct DirectPlan {
  std::vector<int64_t> offsets;     // [taps], in the (c, kh, kw) order of the weight
  std::vector<float> weights;       // block o0 of width ob at o0 * taps: [taps][ob]
  std::vector<int64_t> out_starts;  // chunks of `lanes` positions covering the output plane
  std::vector<int64_t> in_starts;   // where each chunk's first position reads, tap offset 0

  // The read and write starts of chunks first .. first + NV - 1.
  template <int NV>
  void chunk_starts(int64_t first, int64_t (&in)[NV], int64_t (&out)[NV]) const {
    for (int j = 0; j < NV; ++j) in[j] = in_starts[size_t(first + j)];
    for (int j = 0; j < NV; ++j) out[j] = out_starts[size_t(first + j)];
  }
};

// The plan's chunks in runs of Block, then the rest (fewer than Block) as one group: calls
// run(std::integral_constant<int, NV>{}, first chunk, groups of NV), as the channel blocks of
// both kernels take them.
template <int Block, typename Run>
void for_chunk_runs(const DirectPlan& plan, const Run& run) {
  const int64_t chunks = int64_t(plan.out_starts.size()), full = chunks / Block, rest = full * Block;
  run(std::integral_constant<int, Block>{}, int64_t(0), full);
  [&]<int... R>(std::integer_sequence<int, R...>) {
    ((chunks - rest == R + 1 ? run(std::integral_constant<int, R + 1>{}, rest, int64_t(1)) : void()), ...);
  }(std::make_integer_sequence<int, Block - 1>{});
}

// The offsets, the weights in blocks of g.channel_block output channels (none when w is null), and
// chunks of g.lanes positions (the last moved back to end at the plane's end).
DirectPlan direct_plan(const DirectGeometry& g, const float* w);
// x [C, H, W] into the copies [C, copies, copy_rows, copy_w]: copy (c, k) holds at (r, col)
// x[c][r - top][col + k * dilation - left], zero in the padding.
void direct_copy_image(const DirectGeometry& g, const float* x, float* copies);
// Every output channel and chunk of one image from its copies, 16 lanes at a time (g.lanes 16,
// g.channel_block kDirectAvx512ChannelBlock): y = bias + sum over taps of w * x, the AVX2 blocks'
// FMA chain, so the same bits. `streamed`: y written past the cache (whole aligned chunks). Call
// only where cpu_capability() is CpuCapability::Avx512.
inline constexpr int64_t kDirectAvx512ChannelBlock = 4;
void direct_channel_blocks_avx512(const DirectGeometry& g, const DirectPlan& plan, const float* copies,
                                  const float* bias, float* y, bool streamed);

}  // namespace ember::cpu
