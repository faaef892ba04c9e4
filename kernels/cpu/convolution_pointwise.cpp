#include "kernels/cpu/convolution_pointwise.h"

#include <immintrin.h>

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
constexpr int64_t kTaskCols = kPointwiseTaskCols;
// Channels ahead of the one gathered whose input rows are asked for.
constexpr int64_t kPrefetchChannels = 4;

// The weight's row panels (kRows output channels each).
int64_t row_panels(const PointwiseGeometry& g) { return (g.out_channels + kRows - 1) / kRows; }

// d[k] = src[k * stride] for k < len. The stride-2 loop stores whole vectors of 8, so it may
// write up to 7 values past d[len - 1] (the caller's later writes or its slack cover them); no
// read reaches `end`.
void gather_run(float* d, const float* src, int64_t stride, int64_t len, const float* end) {
  int64_t k = 0;
  if (stride == 2)
    for (; k < len && src + 2 * k + 16 <= end; k += 8) {
      // Even lanes of each 128-bit half, then the 64-bit pairs in order: two one-cycle
      // shuffles (the generic two-source permute compiles to two vpermd and a blend).
      const __m256 pairs = _mm256_shuffle_ps(_mm256_loadu_ps(src + 2 * k), _mm256_loadu_ps(src + 2 * k + 8), 0x88);
      _mm256_storeu_ps(d + k, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(pairs), 0xd8)));
    }
  for (; k < len; ++k) d[k] = src[k * stride];
}

// d[0, n) = 0 in whole vectors, so up to 7 zeros past d[n - 1] (covered like gather_run's).
// The runs are mostly empty or a few floats: a memset call for each cost as much as the gather.
void zero(float* d, int64_t n) {
  for (int64_t i = 0; i < n; i += vec8::kLanes) vec8::store8(d + i, vec8::f8{});
}

// Output positions [col0, col0 + cols) of image x [C, H, W] as column panels: panel q holds
// b[p * kCols + j] = x[p] at the position that output column col0 + q * kCols + j reads (zero
// in the padding and past cols). Each channel's positions are first gathered into one compact
// row (`run`, kTaskCols + kCols floats), output row segment by segment in whole vectors, then
// copied into the panels 16 at a time: a segment's pieces of a panel, written straight, were
// mostly too short for vectors.
void gather_panels(const PointwiseGeometry& g, const float* x, const float* x_end, int64_t col0, int64_t cols,
                   float* b, float* run) {
  const int64_t plane = g.height * g.width, sw = g.p.stride[1];
  const int64_t panels = (cols + kCols - 1) / kCols;
  const int64_t lo = g.first_inside(), hi = g.end_inside();
  // The output row segments the task spans, the same in every channel: where each starts in
  // `run`, its length, the columns [a, e) that read the image, and the input row (-1: padding).
  struct Segment {
    int64_t at, len, a, e, ih;
  };
  Segment segments[kTaskCols];
  int64_t count = 0;
  for (int64_t i = col0; i < col0 + cols; ++count) {
    const int64_t oh = i / g.out_w, ow0 = i % g.out_w, ow1 = std::min(g.out_w, ow0 + col0 + cols - i);
    const int64_t ih = oh * g.p.stride[0] - g.p.padding_begin[0];
    const int64_t a = std::clamp(lo, ow0, ow1), e = std::clamp(hi, a, ow1);
    segments[count] = {i - col0, ow1 - ow0, a - ow0, e - ow0, ih >= 0 && ih < g.height ? ih : -1};
    i += ow1 - ow0;
  }
  for (int64_t p = 0; p < g.channels; ++p) {
    // Rows a few channels ahead are asked for from L2 (where the previous task's multiplies
    // had them fetched): the loads of one channel's short runs alone leave the core waiting.
    if (p + kPrefetchChannels < g.channels)
      for (int64_t s = 0; s < count; ++s)
        if (segments[s].ih >= 0 && segments[s].e > segments[s].a) {
          const float* row = x + (p + kPrefetchChannels) * plane + segments[s].ih * g.width;
          for (int64_t k = 0; k < g.width; k += 16) __builtin_prefetch(row + k);
        }
    for (int64_t s = 0; s < count; ++s) {
      const Segment& seg = segments[s];
      float* d = run + seg.at;
      if (seg.ih < 0) {
        zero(d, seg.len);
        continue;
      }
      const int64_t ow0 = (col0 + seg.at) % g.out_w;
      const float* row = x + p * plane + seg.ih * g.width - g.p.padding_begin[1];
      zero(d, seg.a);
      gather_run(d + seg.a, row + (ow0 + seg.a) * sw, sw, seg.e - seg.a, x_end);
      zero(d + seg.e, seg.len - seg.e);
    }
    zero(run + cols, panels * kCols - cols);
    for (int64_t q = 0; q < panels; ++q) {
      float* dst = b + q * g.channels * kCols + p * kCols;
      vec8::store8(dst, vec8::load8(run + q * kCols));
      vec8::store8(dst + 8, vec8::load8(run + q * kCols + 8));
    }
  }
}

// Asks for the input rows that output positions [col0, col0 + cols) of image x read in
// channels [c0, c1). The channels' short row pieces are too many streams for the hardware
// prefetcher, and the gather, left to wait for them, ran at a third of the memory's pace.
void prefetch_task_rows(const PointwiseGeometry& g, const float* x, int64_t col0, int64_t cols, int64_t c0,
                        int64_t c1) {
  for (int64_t oh = col0 / g.out_w; oh <= (col0 + cols - 1) / g.out_w; ++oh) {
    const int64_t ih = oh * g.p.stride[0] - g.p.padding_begin[0];
    if (ih < 0 || ih >= g.height) continue;
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t k = 0; k < g.width; k += 16) __builtin_prefetch(x + (c * g.height + ih) * g.width + k, 0, 1);
  }
}

// y[:, col0 : col0 + cols] of one image [O, Ho*Wo] from the packed weight and gathered panels.
// Between row panels it asks for a share of the next task's input rows (positions
// [next_col0, next_col0 + next_cols) of image next_x, or none when null), so the next gather
// finds them in cache and the loads overlap the multiplies.
void multiply_task(const PointwiseGeometry& g, const float* packed_w, const float* b, const float* bias, float* y,
                   int64_t col0, int64_t cols, float* tile, const float* next_x, int64_t next_col0,
                   int64_t next_cols) {
  const int64_t panels = (cols + kCols - 1) / kCols, area = g.area(), weight_panels = row_panels(g);
  for (int64_t r = 0; r < weight_panels; ++r) {
    if (next_x)
      prefetch_task_rows(g, next_x, next_col0, next_cols, r * g.channels / weight_panels,
                         (r + 1) * g.channels / weight_panels);
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

PointwiseTile pointwise_tile_for_this_cpu() {
  if (packed_kernel_for_this_cpu() == PackedKernel::Avx512)
    return {kPackedAvx512Rows,
            kPackedAvx512Cols,
            packed_micro_kernel_avx512,
            strided_b_micro_kernel_avx512,
            streamed_b_micro_kernel_avx512,
            {part_b_micro_kernel_avx512<4, false>, part_b_micro_kernel_avx512<8, false>},
            {part_b_micro_kernel_avx512<4, true>, part_b_micro_kernel_avx512<8, true>}};
  return {kPackedAvx2Rows, kPackedAvx2Cols, packed_micro_kernel_avx2, strided_b_micro_kernel_avx2, nullptr};
}

void pack_pointwise_weight(const PointwiseGeometry& g, int64_t rows, const float* w, float* packed) {
  const int64_t panels = (g.out_channels + rows - 1) / rows;
  for (int64_t r = 0; r < panels; ++r)
    for (int64_t p = 0; p < g.channels; ++p)
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t o = r * rows + i;
        packed[(r * g.channels + p) * rows + i] = o < g.out_channels ? w[o * g.channels + p] : 0.0f;
      }
}

bool pointwise_conv_applies(const Shape& x, const Shape& w, const Shape& y, const Conv2dParams& p) {
  const bool gathers = p.stride[0] != 1 || p.stride[1] != 1 || p.padding_begin[0] != 0 || p.padding_begin[1] != 0;
  return w[2] == 1 && w[3] == 1 && p.groups == 1 && gathers && x[1] > 0 && x[1] <= kPointwiseMaxChannels &&
         y[0] > 0 && y[1] > 0 && y[2] > 0 && y[3] > 0;
}

void pointwise_conv2d(const Tensor& out, const Tensor& input, const Tensor& weight, const Tensor& bias,
                      const Conv2dParams& p) {
  if (packed_kernel_for_this_cpu() == PackedKernel::Avx512)
    return pointwise_conv2d_by_images(out, input, weight, bias, p);
  const Shape &x = input.shape(), &y = out.shape();
  const PointwiseGeometry g{x[1], x[2], x[3], y[1], y[2], y[3], p};
  float* packed_w = thread_scratch<float>(kPointwiseWeightSlot, size_t(row_panels(g) * g.channels * kRows));
  pack_pointwise_weight(g, kRows, weight.data_ptr<float>(), packed_w);
  const float* xd = input.data_ptr<float>();
  const float* bd = bias.defined() ? bias.data_ptr<float>() : nullptr;
  float* yd = out.data_ptr<float>();
  const int64_t tasks_per_image = (g.area() + kTaskCols - 1) / kTaskCols;
  const int64_t x_image = g.channels * g.height * g.width, y_image = g.out_channels * g.area();
  parallel_for(0, x[0] * tasks_per_image, 1, [&](int64_t t0, int64_t t1) {
    const int64_t panel_floats = (kTaskCols / kCols) * g.channels * kCols;
    float* b = thread_scratch<float>(kPointwiseTaskSlot, size_t(panel_floats + kRows * kCols + kTaskCols + kCols));
    float* tile = b + panel_floats;
    float* run = tile + kRows * kCols;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n = t / tasks_per_image, col0 = (t % tasks_per_image) * kTaskCols;
      const int64_t cols = std::min(kTaskCols, g.area() - col0);
      gather_panels(g, xd + n * x_image, xd + x[0] * x_image, col0, cols, b, run);
      const int64_t next = t + 1, next_n = next / tasks_per_image, next_col0 = (next % tasks_per_image) * kTaskCols;
      multiply_task(g, packed_w, b, bd, yd + n * y_image, col0, cols, tile, next < t1 ? xd + next_n * x_image : nullptr,
                    next_col0, std::min(kTaskCols, g.area() - next_col0));
    }
  });
}

}  // namespace ember::cpu
