#include "kernels/cpu/convolution_direct.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/cpu_features.h"
#include "core/parallel.h"
#include "kernels/cpu/convolution_direct_plan.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/vec8.h"

namespace ember::cpu {
namespace {

using native::Conv2dParams;
using vec8::f8;

// The copies of the image (slot 1 is the GEMM path's column buffer, which this replaces).
constexpr int kCopiesSlot = 1;
// Output channels and 8-position chunks held in registers: 3 x 4 accumulators, the three
// weights of a tap and one input vector fill AVX2's sixteen registers.
constexpr int kChannelBlock = 3;
constexpr int kChunkBlock = 4;
// Output size from which its stores go past the cache (streamed_output): about an L2.
constexpr int64_t kStreamMinBytes = int64_t(1) << 20;

// Output channels [o0, o0 + OB), `groups` runs of NV chunks from chunk `first`:
// y = bias + sum over taps of w * x, one load per chunk and tap. `streamed` (whole aligned
// chunks only) writes y past the cache, as streamed_output says.
template <int OB, int NV>
void channel_block(const DirectGeometry& g, const DirectPlan& plan, const float* copies, const float* bias, float* y,
                   int64_t o0, int64_t first, int64_t groups, bool streamed) {
  // Locals, not g's fields: the stores through y could otherwise alias them for the compiler.
  const int64_t taps = g.taps(), area = g.area();
  const int64_t* offsets = plan.offsets.data();
  const float* w = plan.weights.data() + o0 * taps;
  float b[OB];
  for (int q = 0; q < OB; ++q) b[q] = bias ? bias[o0 + q] : 0.0f;
  for (int64_t grp = 0; grp < groups; ++grp) {
    int64_t in_starts[NV], out_starts[NV];
    plan.chunk_starts<NV>(first + grp * NV, in_starts, out_starts);
    f8 acc[OB][NV];
    for (int q = 0; q < OB; ++q)
      for (int j = 0; j < NV; ++j) acc[q][j] = f8{} + b[q];
    for (int64_t t = 0; t < taps; ++t) {
      const float* in = copies + offsets[t];
      f8 wv[OB];
      for (int q = 0; q < OB; ++q) wv[q] = f8(_mm256_broadcast_ss(w + t * OB + q));
      for (int j = 0; j < NV; ++j) {
        const f8 xv = vec8::load8(in + in_starts[j]);
        for (int q = 0; q < OB; ++q) acc[q][j] += wv[q] * xv;
      }
    }
    if (streamed)
      for (int q = 0; q < OB; ++q)
        for (int j = 0; j < NV; ++j) _mm256_stream_ps(y + (o0 + q) * area + out_starts[j], __m256(acc[q][j]));
    else
      for (int q = 0; q < OB; ++q)
        for (int j = 0; j < NV; ++j) vec8::store8(y + (o0 + q) * area + out_starts[j], acc[q][j]);
  }
}

// Every chunk of the plane for output channels [o0, o0 + OB): runs of kChunkBlock, then the
// remainder.
template <int OB>
void channel_block_all(const DirectGeometry& g, const DirectPlan& plan, const float* copies, const float* bias,
                       float* y, int64_t o0, bool streamed) {
  for_chunk_runs<kChunkBlock>(plan, [&](auto nv, int64_t first, int64_t groups) {
    channel_block<OB, decltype(nv)::value>(g, plan, copies, bias, y, o0, first, groups, streamed);
  });
}

// Whether y's stores go past the cache: when every chunk is a whole aligned vector (planes a
// multiple of 8, y 32-byte aligned) and the output outgrows the L2 (kStreamMinBytes). The
// output is the pass's main memory traffic and ordinary stores first fetched each line they
// overwrite.
bool streamed_output(const DirectGeometry& g, int64_t images, const float* y) {
  const int64_t bytes = images * g.out_channels * g.area() * int64_t(sizeof(float));
  return g.area() % g.lanes == 0 && reinterpret_cast<uintptr_t>(y) % (4 * g.lanes) == 0 && bytes >= kStreamMinBytes;
}

int64_t block_width(const DirectGeometry& g, int64_t o0) {
  return std::min<int64_t>(kChannelBlock, g.out_channels - o0);
}

void forward_image(const DirectGeometry& g, const DirectPlan& plan, const float* x, const float* bias, float* y,
                   float* copies, bool streamed) {
  direct_copy_image(g, x, copies);
  if (g.lanes == 16) return direct_channel_blocks_avx512(g, plan, copies, bias, y, streamed);
  for (int64_t o0 = 0; o0 < g.out_channels; o0 += kChannelBlock) switch (block_width(g, o0)) {
      case 1: channel_block_all<1>(g, plan, copies, bias, y, o0, streamed); break;
      case 2: channel_block_all<2>(g, plan, copies, bias, y, o0, streamed); break;
      default: channel_block_all<kChannelBlock>(g, plan, copies, bias, y, o0, streamed); break;
    }
}

}  // namespace

DirectPlan direct_plan(const DirectGeometry& g, const float* w) {
  DirectPlan plan;
  for (int64_t c = 0; c < g.channels; ++c)
    for (int64_t kh = 0; kh < g.kernel_h; ++kh)
      for (int64_t kw = 0; kw < g.kernel_w; ++kw)
        if (g.shifted())  // copy (c, kw), row kh * dilation
          plan.offsets.push_back((c * g.kernel_w + kw) * g.copy_size() + kh * g.p.dilation[0] * g.out_w);
        else  // copy c, row kh * dilation, column kw * dilation
          plan.offsets.push_back(c * g.copy_size() + kh * g.p.dilation[0] * g.copy_w() + kw * g.p.dilation[1]);
  const int64_t taps = g.taps();
  plan.weights.resize(w ? size_t(g.out_channels * taps) : 0);
  for (int64_t o0 = 0; w && o0 < g.out_channels; o0 += g.channel_block) {
    const int64_t ob = std::min(g.channel_block, g.out_channels - o0);
    for (int64_t t = 0; t < taps; ++t)
      for (int64_t q = 0; q < ob; ++q) plan.weights[o0 * taps + t * ob + q] = w[(o0 + q) * taps + t];
  }
  // The last chunk moved back to end at the plane's end: it recomputes a few positions rather
  // than storing a partial vector. Padded copies are read row by row.
  for (int64_t s = 0; s < g.area(); s += g.lanes) {
    const int64_t start = std::min(s, g.area() - g.lanes);
    plan.out_starts.push_back(start);
    plan.in_starts.push_back(g.shifted() ? start : start / g.out_w * g.copy_w() + start % g.out_w);
  }
  return plan;
}

void direct_copy_image(const DirectGeometry& g, const float* x, float* copies) {
  const int64_t top = g.p.padding_begin[0], left = g.p.padding_begin[1], copy_w = g.copy_w();
  for (int64_t c = 0; c < g.channels; ++c)
    for (int64_t k = 0; k < g.copies(); ++k) {
      float* copy = copies + (c * g.copies() + k) * g.copy_size();
      // Columns [lo, hi) read inside the image: iw = col + shift.
      const int64_t shift = k * g.p.dilation[1] - left;
      const int64_t lo = std::clamp<int64_t>(-shift, 0, copy_w), hi = std::clamp<int64_t>(g.width - shift, lo, copy_w);
      for (int64_t r = 0; r < g.copy_rows(); ++r) {
        // Vector moves rather than library calls: the rows are a few vectors long and there
        // are C * kW * rows of them per image.
        float* row = copy + r * copy_w;
        const int64_t ih = r - top;
        const bool inside = ih >= 0 && ih < g.height;
        const float* src = inside ? x + (c * g.height + ih) * g.width + shift : x;
        const int64_t a = inside ? lo : copy_w, e = inside ? hi : copy_w;
        int64_t col = 0;
        for (; col < a; ++col) row[col] = 0.0f;
        for (; col + vec8::kLanes <= e; col += vec8::kLanes) vec8::store8(row + col, vec8::load8(src + col));
        for (; col < e; ++col) row[col] = src[col];
        for (; col < copy_w; ++col) row[col] = 0.0f;
      }
    }
}

bool direct_conv_applies(const Shape& x, const Shape& w, const Shape& y, const Conv2dParams& p) {
  return p.groups == 1 && p.stride[0] == 1 && p.stride[1] == 1 && w[1] * w[2] * w[3] <= kDirectMaxTaps &&
         y[2] * y[3] >= vec8::kLanes && x[0] > 0 && y[1] > 0;
}

void direct_conv2d(const Tensor& out, const Tensor& input, const Tensor& weight, const Tensor& bias,
                   const Conv2dParams& p) {
  const Shape &x = input.shape(), &w = weight.shape(), &y = out.shape();
  // AVX-512 where the plane has a 16-position chunk; its blocks compute the same FMA chains.
  const bool avx512 = cpu_capability() == CpuCapability::Avx512 && y[2] * y[3] >= 16;
  const int64_t lanes = avx512 ? 16 : vec8::kLanes, block = avx512 ? kDirectAvx512ChannelBlock : kChannelBlock;
  const DirectGeometry g{x[1], x[2], x[3], w[0], w[2], w[3], y[2], y[3], p, lanes, block};
  const DirectPlan plan = direct_plan(g, weight.data_ptr<float>());
  const float* xd = input.data_ptr<float>();
  const float* bd = bias.defined() ? bias.data_ptr<float>() : nullptr;
  float* yd = out.data_ptr<float>();
  const int64_t x_image = g.channels * g.height * g.width, y_image = g.out_channels * g.area();
  const bool streamed = streamed_output(g, x[0], yd);
  parallel_for(0, x[0], 1, [&](int64_t n0, int64_t n1) {
    float* copies = thread_scratch<float>(kCopiesSlot, size_t(g.channels * g.copies() * g.copy_size()));
    for (int64_t n = n0; n < n1; ++n)
      forward_image(g, plan, xd + n * x_image, bd, yd + n * y_image, copies, streamed);
    if (streamed) _mm_sfence();  // the streamed lines reach memory before another thread reads them
  });
}

}  // namespace ember::cpu
