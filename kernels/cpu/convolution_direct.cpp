#include "kernels/cpu/convolution_direct.h"

#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/vec8.h"

namespace ember::cpu {
namespace {

using native::Conv2dParams;
using vec8::f8;

// The zero-padded image (slot 1 is the GEMM path's column buffer, which this replaces).
constexpr int kPaddedSlot = 1;
// Output channels and 8-column chunks held in registers: 3 x 4 accumulators, the three weights
// of a tap and one input vector fill AVX2's sixteen registers.
constexpr int kChannelBlock = 3;
constexpr int kChunkBlock = 4;

struct DirectGeometry {
  int64_t channels, height, width, out_channels, kernel_h, kernel_w, out_h, out_w;
  int64_t padded_h, padded_w;  // the padded image covers every position a window reads
  Conv2dParams p;
  int64_t taps() const { return channels * kernel_h * kernel_w; }
};

// The tap-independent parts of one call: where each tap reads in the padded image (relative to
// the output position), the weights regrouped per block of output channels, the chunk starts.
struct DirectPlan {
  std::vector<int64_t> offsets;  // [taps], in the (c, kh, kw) order of the weight
  std::vector<float> weights;    // block o0 of width ob at o0 * taps: [taps][ob]
  std::vector<int64_t> starts;   // 8-column chunks covering an output row
};

// Output channels [o0, o0 + OB), the NV chunks at `starts`, every output row:
// y = bias + sum over taps of w * x.
template <int OB, int NV>
void channel_block(const DirectGeometry& g, const DirectPlan& plan, const float* padded, const float* bias, float* y,
                   int64_t o0, const int64_t* chunk_starts) {
  // Locals, not g's fields: the stores through y could otherwise alias them for the compiler.
  const int64_t taps = g.taps(), area = g.out_h * g.out_w, out_h = g.out_h, out_w = g.out_w;
  const int64_t padded_w = g.padded_w;
  const int64_t* offsets = plan.offsets.data();
  const float* w = plan.weights.data() + o0 * taps;
  int64_t starts[NV];
  for (int j = 0; j < NV; ++j) starts[j] = chunk_starts[j];
  for (int64_t oh = 0; oh < out_h; ++oh) {
    const float* base = padded + oh * padded_w;
    f8 acc[OB][NV];
    for (int q = 0; q < OB; ++q)
      for (int j = 0; j < NV; ++j) acc[q][j] = f8{} + (bias ? bias[o0 + q] : 0.0f);
    for (int64_t t = 0; t < taps; ++t) {
      const float* in = base + offsets[t];
      f8 wv[OB];
      for (int q = 0; q < OB; ++q) wv[q] = f8(_mm256_broadcast_ss(w + t * OB + q));
      for (int j = 0; j < NV; ++j) {
        const f8 xv = vec8::load8(in + starts[j]);
        for (int q = 0; q < OB; ++q) acc[q][j] += wv[q] * xv;
      }
    }
    for (int q = 0; q < OB; ++q)
      for (int j = 0; j < NV; ++j) vec8::store8(y + (o0 + q) * area + oh * out_w + starts[j], acc[q][j]);
  }
}

template <int OB>
void channel_block_any(int nv, const DirectGeometry& g, const DirectPlan& plan, const float* padded,
                       const float* bias, float* y, int64_t o0, const int64_t* starts) {
  switch (nv) {
    case 1: return channel_block<OB, 1>(g, plan, padded, bias, y, o0, starts);
    case 2: return channel_block<OB, 2>(g, plan, padded, bias, y, o0, starts);
    case 3: return channel_block<OB, 3>(g, plan, padded, bias, y, o0, starts);
    default: return channel_block<OB, 4>(g, plan, padded, bias, y, o0, starts);
  }
}

int64_t block_width(const DirectGeometry& g, int64_t o0) {
  return std::min<int64_t>(kChannelBlock, g.out_channels - o0);
}

DirectPlan plan_of(const DirectGeometry& g, const float* w) {
  DirectPlan plan;
  for (int64_t c = 0; c < g.channels; ++c)
    for (int64_t kh = 0; kh < g.kernel_h; ++kh)
      for (int64_t kw = 0; kw < g.kernel_w; ++kw)
        plan.offsets.push_back((c * g.padded_h + kh * g.p.dilation[0]) * g.padded_w + kw * g.p.dilation[1]);
  const int64_t taps = g.taps();
  plan.weights.resize(size_t(g.out_channels * taps));
  for (int64_t o0 = 0; o0 < g.out_channels; o0 += kChannelBlock) {
    const int64_t ob = block_width(g, o0);
    for (int64_t t = 0; t < taps; ++t)
      for (int64_t q = 0; q < ob; ++q) plan.weights[o0 * taps + t * ob + q] = w[(o0 + q) * taps + t];
  }
  // The last chunk moved back to end at the row's end: it recomputes a few columns rather than
  // storing a partial vector.
  for (int64_t s = 0; s < g.out_w; s += vec8::kLanes) plan.starts.push_back(std::min(s, g.out_w - vec8::kLanes));
  return plan;
}

// x [C, H, W] into padded [C, padded_h, padded_w], zero where a window reads padding.
void pad_image(const DirectGeometry& g, const float* x, float* padded) {
  std::fill(padded, padded + g.channels * g.padded_h * g.padded_w, 0.0f);
  const int64_t top = g.p.padding_begin[0], left = g.p.padding_begin[1];
  const int64_t cols = std::min(g.width, g.padded_w - left);
  if (cols <= 0) return;
  for (int64_t c = 0; c < g.channels; ++c)
    for (int64_t ih = 0; ih < g.height && ih + top < g.padded_h; ++ih)
      std::copy(x + (c * g.height + ih) * g.width, x + (c * g.height + ih) * g.width + cols,
                padded + (c * g.padded_h + ih + top) * g.padded_w + left);
}

void forward_image(const DirectGeometry& g, const DirectPlan& plan, const float* x, const float* bias, float* y,
                   float* padded) {
  pad_image(g, x, padded);
  const int64_t chunks = int64_t(plan.starts.size());
  for (int64_t o0 = 0; o0 < g.out_channels; o0 += kChannelBlock)
    for (int64_t j0 = 0; j0 < chunks; j0 += kChunkBlock) {
      const int nv = int(std::min<int64_t>(kChunkBlock, chunks - j0));
      const int64_t* starts = plan.starts.data() + j0;
      switch (block_width(g, o0)) {
        case 1: channel_block_any<1>(nv, g, plan, padded, bias, y, o0, starts); break;
        case 2: channel_block_any<2>(nv, g, plan, padded, bias, y, o0, starts); break;
        default: channel_block_any<kChannelBlock>(nv, g, plan, padded, bias, y, o0, starts); break;
      }
    }
}

}  // namespace

bool direct_conv_applies(const Shape& x, const Shape& w, const Shape& y, const Conv2dParams& p) {
  return p.groups == 1 && p.stride[0] == 1 && p.stride[1] == 1 && w[1] * w[2] * w[3] <= kDirectMaxTaps &&
         y[3] >= vec8::kLanes && x[0] > 0 && y[1] > 0 && y[2] > 0;
}

void direct_conv2d(const Tensor& out, const Tensor& input, const Tensor& weight, const Tensor& bias,
                   const Conv2dParams& p) {
  const Shape &x = input.shape(), &w = weight.shape(), &y = out.shape();
  DirectGeometry g{x[1], x[2], x[3], w[0], w[2], w[3], y[2], y[3], 0, 0, p};
  g.padded_h = g.out_h + (g.kernel_h - 1) * p.dilation[0];
  g.padded_w = g.out_w + (g.kernel_w - 1) * p.dilation[1];
  const DirectPlan plan = plan_of(g, weight.data_ptr<float>());
  const float* xd = input.data_ptr<float>();
  const float* bd = bias.defined() ? bias.data_ptr<float>() : nullptr;
  float* yd = out.data_ptr<float>();
  const int64_t x_image = g.channels * g.height * g.width, y_image = g.out_channels * g.out_h * g.out_w;
  parallel_for(0, x[0], 1, [&](int64_t n0, int64_t n1) {
    float* padded = thread_scratch<float>(kPaddedSlot, size_t(g.channels * g.padded_h * g.padded_w));
    for (int64_t n = n0; n < n1; ++n) forward_image(g, plan, xd + n * x_image, bd, yd + n * y_image, padded);
  });
}

}  // namespace ember::cpu
