#include "kernels/cpu/convolution_pointwise.h"

#include <algorithm>

#include "core/parallel.h"
#include "kernels/cpu/gemm_packed.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/vec8.h"

namespace ember::cpu {
namespace {

using native::Conv2dParams;

// The AVX2 tile (the baseline build's ISA, so every CPU Ember runs on has it).
constexpr int64_t kRows = kPackedAvx2Rows;
constexpr int64_t kCols = kPackedAvx2Cols;
// Output positions one task gathers: 8 panels, a few tens of KiB at 64 channels, in L1/L2
// while every row panel of the weight passes over them.
constexpr int64_t kTaskCols = 8 * kCols;
// Scratch: the caller's packed weight, each task's panels and edge tile.
constexpr int kPackedWeightSlot = 2;
constexpr int kPanelSlot = 3;

struct PointwiseGeometry {
  int64_t channels, height, width, out_channels, out_h, out_w;
  Conv2dParams p;
  int64_t area() const { return out_h * out_w; }
  int64_t row_panels() const { return (out_channels + kRows - 1) / kRows; }
  // The output columns [lo, hi) whose input column lies inside the image.
  int64_t first_inside() const {
    return std::min(out_w, (p.padding_begin[1] + p.stride[1] - 1) / p.stride[1]);
  }
  int64_t end_inside() const {
    return std::clamp<int64_t>((width - 1 + p.padding_begin[1]) / p.stride[1] + 1, first_inside(), out_w);
  }
};

// Task columns [r, r + len) of channel p into the column panels b (panel r / kCols, lane
// r % kCols): src[k * stride] for k < len, or zeros when src is null. No read reaches `end`.
void put_run(float* b, int64_t channels, int64_t p, int64_t r, const float* src, int64_t stride, int64_t len,
             const float* end) {
  while (len > 0) {
    const int64_t lane = r % kCols, n = std::min(len, kCols - lane);
    float* d = b + (r / kCols * channels + p) * kCols + lane;
    int64_t k = 0;
    if (!src) {
      std::fill(d, d + n, 0.0f);
    } else if (stride == 2) {
      for (; k + 8 <= n && src + 2 * k + 16 <= end; k += 8) {
        const vec8::f8 lo = vec8::load8(src + 2 * k), hi = vec8::load8(src + 2 * k + 8);
        vec8::store8(d + k, __builtin_shufflevector(lo, hi, 0, 2, 4, 6, 8, 10, 12, 14));
      }
    }
    if (src)
      for (; k < n; ++k) d[k] = src[k * stride];
    r += n, len -= n;
    if (src) src += n * stride;
  }
}

// W [O, C] as row panels: panel r holds a[p * kRows + i] = W[r * kRows + i][p], zero past O.
void pack_weight(const PointwiseGeometry& g, const float* w, float* packed) {
  for (int64_t r = 0; r < g.row_panels(); ++r)
    for (int64_t p = 0; p < g.channels; ++p)
      for (int64_t i = 0; i < kRows; ++i) {
        const int64_t o = r * kRows + i;
        packed[(r * g.channels + p) * kRows + i] = o < g.out_channels ? w[o * g.channels + p] : 0.0f;
      }
}

// Output positions [col0, col0 + cols) of image x [C, H, W] as column panels: panel q holds
// b[p * kCols + j] = x[p] at the position that output column col0 + q * kCols + j reads (zero
// in the padding and past cols). Walks the output row segments the task spans, so each
// channel's run is one strided copy.
void gather_panels(const PointwiseGeometry& g, const float* x, const float* x_end, int64_t col0, int64_t cols,
                   float* b) {
  const int64_t plane = g.height * g.width, sw = g.p.stride[1];
  const int64_t full_panels = cols / kCols, panel = g.channels * kCols;
  if (cols % kCols != 0) std::fill(b + full_panels * panel, b + (full_panels + 1) * panel, 0.0f);
  const int64_t lo = g.first_inside(), hi = g.end_inside();
  for (int64_t i = col0; i < col0 + cols;) {
    const int64_t oh = i / g.out_w, ow0 = i % g.out_w, ow1 = std::min(g.out_w, ow0 + col0 + cols - i);
    const int64_t ih = oh * g.p.stride[0] - g.p.padding_begin[0];
    const int64_t a = std::clamp(lo, ow0, ow1), e = std::clamp(hi, a, ow1);
    const bool row_inside = ih >= 0 && ih < g.height;
    const int64_t r = i - col0;
    // The 64-odd channel streams, a few lines each, are too many for the hardware prefetcher:
    // ask for the input row the next output row reads while this one is gathered.
    const int64_t next_ih = ih + g.p.stride[0];
    const bool prefetch = next_ih >= 0 && next_ih < g.height;
    for (int64_t p = 0; p < g.channels; ++p) {
      if (prefetch)
        for (int64_t k = 0; k < g.width; k += 16) __builtin_prefetch(x + p * plane + next_ih * g.width + k);
      if (!row_inside) {
        put_run(b, g.channels, p, r, nullptr, sw, ow1 - ow0, x_end);
        continue;
      }
      const float* row = x + p * plane + ih * g.width - g.p.padding_begin[1];
      put_run(b, g.channels, p, r, nullptr, sw, a - ow0, x_end);
      put_run(b, g.channels, p, r + a - ow0, row + a * sw, sw, e - a, x_end);
      put_run(b, g.channels, p, r + e - ow0, nullptr, sw, ow1 - e, x_end);
    }
    i += ow1 - ow0;
  }
}

// y[:, col0 : col0 + cols] of one image [O, Ho*Wo] from the packed weight and gathered panels.
void multiply_task(const PointwiseGeometry& g, const float* packed_w, const float* b, const float* bias, float* y,
                   int64_t col0, int64_t cols, float* tile) {
  const int64_t panels = (cols + kCols - 1) / kCols, area = g.area();
  for (int64_t r = 0; r < g.row_panels(); ++r) {
    const float* a = packed_w + r * g.channels * kRows;
    const int64_t rows = std::min(kRows, g.out_channels - r * kRows);
    for (int64_t q = 0; q < panels; ++q) {
      const int64_t width = std::min(kCols, cols - q * kCols);
      float* c = y + r * kRows * area + col0 + q * kCols;
      const bool full = rows == kRows && width == kCols;
      packed_micro_kernel_avx2(g.channels, a, b + q * g.channels * kCols, full ? c : tile, full ? area : kCols, 1.0f,
                               0.0f);
      if (!full)
        for (int64_t i = 0; i < rows; ++i) std::copy(tile + i * kCols, tile + i * kCols + width, c + i * area);
      if (bias)
        for (int64_t i = 0; i < rows; ++i)
          for (float* v = c + i * area; v != c + i * area + width; ++v) *v += bias[r * kRows + i];
    }
  }
}

}  // namespace

bool pointwise_conv_applies(const Shape& x, const Shape& w, const Shape& y, const Conv2dParams& p) {
  const bool gathers = p.stride[0] != 1 || p.stride[1] != 1 || p.padding_begin[0] != 0 || p.padding_begin[1] != 0;
  return w[2] == 1 && w[3] == 1 && p.groups == 1 && gathers && x[1] > 0 && x[1] <= kPointwiseMaxChannels &&
         y[0] > 0 && y[1] > 0 && y[2] > 0 && y[3] > 0;
}

void pointwise_conv2d(const Tensor& out, const Tensor& input, const Tensor& weight, const Tensor& bias,
                      const Conv2dParams& p) {
  const Shape &x = input.shape(), &y = out.shape();
  const PointwiseGeometry g{x[1], x[2], x[3], y[1], y[2], y[3], p};
  float* packed_w = thread_scratch<float>(kPackedWeightSlot, size_t(g.row_panels() * g.channels * kRows));
  pack_weight(g, weight.data_ptr<float>(), packed_w);
  const float* xd = input.data_ptr<float>();
  const float* bd = bias.defined() ? bias.data_ptr<float>() : nullptr;
  float* yd = out.data_ptr<float>();
  const int64_t tasks_per_image = (g.area() + kTaskCols - 1) / kTaskCols;
  const int64_t x_image = g.channels * g.height * g.width, y_image = g.out_channels * g.area();
  parallel_for(0, x[0] * tasks_per_image, 1, [&](int64_t t0, int64_t t1) {
    const int64_t panel_floats = (kTaskCols / kCols) * g.channels * kCols;
    float* b = thread_scratch<float>(kPanelSlot, size_t(panel_floats + kRows * kCols));
    float* tile = b + panel_floats;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n = t / tasks_per_image, col0 = (t % tasks_per_image) * kTaskCols;
      const int64_t cols = std::min(kTaskCols, g.area() - col0);
      gather_panels(g, xd + n * x_image, xd + x[0] * x_image, col0, cols, b);
      multiply_task(g, packed_w, b, bd, yd + n * y_image, col0, cols, tile);
    }
  });
}

}  // namespace ember::cpu
