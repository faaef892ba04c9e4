// The direct kernel's register blocks on AVX-512 (convolution_direct_plan.h): 4 output channels by
// 6 chunks of 16 positions in 24 zmm accumulators, with the four weights of a tap and one input
// vector, 24 FMAs per tap against 6 loads and 4 broadcasts. Each output is the AVX2 blocks' chain,
// the bias then fma(w, x, acc) tap by tap, so the results are the same bits.

#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/convolution_direct_plan.h"

#include "kernels/cpu/avx512_code_begin.inc"

namespace ember::cpu {
namespace {

constexpr int kChannelBlock = int(kDirectAvx512ChannelBlock);
constexpr int kChunkBlock = 6;

// Output channels [o0, o0 + OB), `groups` runs of NV chunks from chunk `first`.
template <int OB, int NV>
void channel_block(const DirectGeometry& g, const DirectPlan& plan, const float* copies, const float* bias, float* y,
                   int64_t o0, int64_t first, int64_t groups, bool streamed) {
  // Locals, not g's fields: the stores through y could otherwise alias them for the compiler.
  const int64_t taps = g.taps(), area = g.area();
  const int64_t* offsets = plan.offsets.data();
  const float* w = plan.weights.data() + o0 * taps;
  float seed[OB];
  for (int q = 0; q < OB; ++q) seed[q] = 0.0f + (bias ? bias[o0 + q] : 0.0f);  // the AVX2 blocks' f8{} + b
  for (int64_t grp = 0; grp < groups; ++grp) {
    int64_t in_starts[NV], out_starts[NV];
    plan.chunk_starts<NV>(first + grp * NV, in_starts, out_starts);
    __m512 acc[OB][NV];
    for (int q = 0; q < OB; ++q)
      for (int j = 0; j < NV; ++j) acc[q][j] = _mm512_set1_ps(seed[q]);
    for (int64_t t = 0; t < taps; ++t) {
      const float* in = copies + offsets[t];
      __m512 wv[OB];
      for (int q = 0; q < OB; ++q) wv[q] = _mm512_set1_ps(w[t * OB + q]);
      for (int j = 0; j < NV; ++j) {
        const __m512 xv = _mm512_loadu_ps(in + in_starts[j]);
        for (int q = 0; q < OB; ++q) acc[q][j] = _mm512_fmadd_ps(wv[q], xv, acc[q][j]);
      }
    }
    if (streamed)
      for (int q = 0; q < OB; ++q)
        for (int j = 0; j < NV; ++j) _mm512_stream_ps(y + (o0 + q) * area + out_starts[j], acc[q][j]);
    else
      for (int q = 0; q < OB; ++q)
        for (int j = 0; j < NV; ++j) _mm512_storeu_ps(y + (o0 + q) * area + out_starts[j], acc[q][j]);
  }
}

template <int OB>
void channel_block_all(const DirectGeometry& g, const DirectPlan& plan, const float* copies, const float* bias,
                       float* y, int64_t o0, bool streamed) {
  for_chunk_runs<kChunkBlock>(plan, [&](auto nv, int64_t first, int64_t groups) {
    channel_block<OB, decltype(nv)::value>(g, plan, copies, bias, y, o0, first, groups, streamed);
  });
}

}  // namespace

void direct_channel_blocks_avx512(const DirectGeometry& g, const DirectPlan& plan, const float* copies,
                                  const float* bias, float* y, bool streamed) {
  for (int64_t o0 = 0; o0 < g.out_channels; o0 += kChannelBlock)
    switch (std::min<int64_t>(kChannelBlock, g.out_channels - o0)) {
      case 1:
        channel_block_all<1>(g, plan, copies, bias, y, o0, streamed);
        break;
      case 2:
        channel_block_all<2>(g, plan, copies, bias, y, o0, streamed);
        break;
      case 3:
        channel_block_all<3>(g, plan, copies, bias, y, o0, streamed);
        break;
      default:
        channel_block_all<kChannelBlock>(g, plan, copies, bias, y, o0, streamed);
        break;
    }
}

}  // namespace ember::cpu

#include "kernels/cpu/avx512_code_end.inc"
