// The input gradient of a gathered 1x1 convolution (convolution_pointwise.h). An image's
// dX [C, H, W] is zero except where a window reads, and there it is (W^T dY) [C, Ho*Wo] at that
// window's position. A task takes a few whole output rows of one image: it packs their dY
// columns into the micro-kernel's panels, multiplies the transposed weight (packed once per
// call) into a compact [C, positions] tile that stays in cache, and writes the dX rows those
// output rows own, values and zeros together, channel by channel. dY is read in place by the
// micro-kernel (no packing but for a last partial panel). The GEMM path's column buffer (W^T dY
// of a whole image, then spread) left the cache and came back, and the GEMM packed dY and the
// transposed weight again for every image.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "core/cpu_features.h"
#include "core/parallel.h"
#include "kernels/cpu/convolution_pointwise.h"
#include "kernels/cpu/convolution_pointwise_spread.h"
#include "kernels/cpu/gemm_packed.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/vec8.h"

namespace ember::cpu {
namespace {

using native::Conv2dParams;

// The transposed weight's row panels (t.rows input channels each).
int64_t row_panels(const PointwiseGeometry& g, const PointwiseTile& t) { return (g.channels + t.rows - 1) / t.rows; }

// Output rows per task: about kPointwiseTaskCols positions. On the AVX-512 tile, the count from
// there to twice it whose positions leave the last 32-column panel least empty (28-wide rows: 8
// rows fill 7 panels, where 4 rows left half of a fourth panel zeros, a seventh of the multiplies
// wasted).
int64_t rows_per_task(const PointwiseGeometry& g, const PointwiseTile& t) {
  const int64_t base = std::max<int64_t>(1, kPointwiseTaskCols / g.out_w);
  if (t.cols == kPackedAvx2Cols) return base;
  auto waste = [&](int64_t r) { return double((r * g.out_w + t.cols - 1) / t.cols * t.cols) / double(r * g.out_w); };
  int64_t best = base;
  for (int64_t r = base + 1; r <= 2 * base; ++r)
    if (waste(r) < waste(best)) best = r;
  return best;
}
int64_t tasks_per_image(const PointwiseGeometry& g, const PointwiseTile& t) {
  return (g.out_h + rows_per_task(g, t) - 1) / rows_per_task(g, t);
}
// The most column panels one task spans.
int64_t max_panels(const PointwiseGeometry& g, const PointwiseTile& t) {
  return (rows_per_task(g, t) * g.out_w + t.cols - 1) / t.cols;
}

// W [O, C] transposed into row panels over C: panel r holds a[o * rows + i] = W[o][r * rows + i],
// zero past C.
void pack_transposed_weight(const PointwiseGeometry& g, const PointwiseTile& t, const float* w, float* packed) {
  for (int64_t r = 0; r < row_panels(g, t); ++r)
    for (int64_t o = 0; o < g.out_channels; ++o)
      for (int64_t i = 0; i < t.rows; ++i) {
        const int64_t c = r * t.rows + i;
        packed[(r * g.out_channels + o) * t.rows + i] = c < g.channels ? w[o * g.channels + c] : 0.0f;
      }
}

// The last panel's columns when fewer than t.cols remain ([col0, col0 + cols) of one image's dY):
// edge[o * t.cols + j] = dy[o][col0 + j], zero past cols. Full panels are read in place.
void pack_edge_panel(const PointwiseGeometry& g, const PointwiseTile& t, const float* dy, int64_t col0, int64_t cols,
                     float* edge) {
  for (int64_t o = 0; o < g.out_channels; ++o) {
    const float* src = dy + o * g.area() + col0;
    std::copy(src, src + cols, edge + o * t.cols);
    std::fill(edge + o * t.cols + cols, edge + (o + 1) * t.cols, 0.0f);
  }
}

// The compact tile [row_panels * t.rows, ld] = W^T (zero rows past C) times dY's columns
// [col0, col0 + cols) of one image: full panels read from dY in place, the last partial one from
// `edge`. Panel by panel, so its dY lines stay in L1 while every row panel of the weight passes
// over them; between panels a share of the next task's dY rows (`next`, next_cols columns, or
// none when null) is asked for: its 100-odd short row pieces are too many streams for the
// hardware prefetcher.
void multiply(const PointwiseGeometry& g, const PointwiseTile& t, const float* packed_w, const float* dy, int64_t col0,
              int64_t cols, const float* edge, float* tile, const float* next, int64_t next_cols) {
  const int64_t full = cols / t.cols, panels = (cols + t.cols - 1) / t.cols, ld = panels * t.cols;
  for (int64_t q = 0; q < panels; ++q) {
    for (int64_t r = 0; r < row_panels(g, t); ++r) {
      const float* a = packed_w + r * g.out_channels * t.rows;
      float* c = tile + r * t.rows * ld + q * t.cols;
      // A last panel of 4 or 8 channels on AVX-512: the tile's first rows only (spread reads no others).
      const int64_t rows = std::min(t.rows, g.channels - r * t.rows);
      if (q < full)
        t.strided_for(rows)(g.out_channels, a, dy + col0 + q * t.cols, g.area(), c, ld, 1.0f, 0.0f);
      else
        t.packed(g.out_channels, a, edge, c, ld, 1.0f, 0.0f);
    }
    if (next)
      for (int64_t o = q * g.out_channels / panels; o < (q + 1) * g.out_channels / panels; ++o)
        for (int64_t j = 0; j < next_cols; j += 16) __builtin_prefetch(next + o * g.area() + j);
  }
}

// row[0, width) = zero, in whole aligned vectors written past the cache (width a multiple of 8,
// row 32-byte aligned): dX is larger than the caches and is not read here, and ordinary stores
// first fetched every line they overwrite, half the pass's memory traffic.
void stream_fill(float* row, int64_t width, float zero) {
  const __m256 z = _mm256_set1_ps(zero);
  for (int64_t j = 0; j < width; j += 8) _mm256_stream_ps(row + j, z);
}

// A stride-2 row without left padding, streamed like stream_fill: row[2 * ow] = s[ow] + add for
// ow < hi, every other float `zero`. Each vector takes four values, the last fewer under a mask.
void stream_stride2_row(float* row, const float* s, int64_t hi, int64_t width, float add, float zero) {
  const __m128 va = _mm_set1_ps(add), vz = _mm_set1_ps(zero);
  for (int64_t j = 0; j < width; j += 8) {
    const int64_t ow = j / 2, m = std::clamp<int64_t>(hi - ow, 0, 4);
    __m128 v;
    if (m == 4) {
      v = _mm_add_ps(_mm_loadu_ps(s + ow), va);
    } else {
      const __m128i mask = _mm_cmpgt_epi32(_mm_set1_epi32(int(m)), _mm_setr_epi32(0, 1, 2, 3));
      v = _mm_add_ps(_mm_maskload_ps(s + ow, mask), va);  // masked lanes: 0 + add, the zero
    }
    _mm256_stream_ps(row + j, _mm256_set_m128(_mm_unpackhi_ps(v, vz), _mm_unpacklo_ps(v, vz)));
  }
}

// dX rows [ih0, ih1) of one image from the tile of output rows from oh0 on (row stride ld),
// channel by channel: a row some output row reads holds that row's values every stride-th
// column, the rest zero; plus bias[c] on channel c when given (added to the values and zeros as
// the GEMM path adds it). On AVX-512 the rows go out a channel's stretch at a time in whole lines
// where they can (convolution_pointwise_spread.h).
void spread(const PointwiseGeometry& g, const float* tile, int64_t ld, int64_t oh0, int64_t ih0, int64_t ih1,
            const float* bias, float* dx) {
  const int64_t sh = g.p.stride[0], sw = g.p.stride[1], top = g.p.padding_begin[0], left = g.p.padding_begin[1];
  const int64_t lo = g.first_inside(), hi = g.end_inside(), width = g.width;
  const bool streamed = sw == 2 && left == 0 && width % 8 == 0 && reinterpret_cast<uintptr_t>(dx) % 32 == 0;
  const bool whole_lines =
      cpu_capability() == CpuCapability::Avx512 && stride2_rows_stream_whole_lines(g, dx, ih0, ih1);
  for (int64_t c = 0; c < g.channels; ++c) {
    // x + (-0) is x for every x, so without a bias the values pass unchanged.
    const float add = bias ? bias[c] : -0.0f, zero = bias ? 0.0f + bias[c] : 0.0f;
    if (whole_lines) {
      stream_stride2_rows_avx512(g, tile + c * ld, oh0, ih0, ih1, add, dx + c * g.height * width);
      continue;
    }
    for (int64_t ih = ih0; ih < ih1; ++ih) {
      float* row = dx + (c * g.height + ih) * width;
      const int64_t oh = (ih + top) / sh;
      const bool reads = (ih + top) % sh == 0 && oh < g.out_h;
      const float* s = tile + c * ld + (oh - oh0) * g.out_w;
      if (streamed) {
        if (reads) stream_stride2_row(row, s, hi, width, add, zero);
        else stream_fill(row, width, zero);
        continue;
      }
      if (!reads) {
        std::fill(row, row + width, zero);
        continue;
      }
      int64_t ow = lo;
      if (sw == 2 && left == 0) {  // eight values and the zeros between them as two whole vectors
        const vec8::f8 va = vec8::f8{} + add, vz = vec8::f8{} + zero;
        for (; ow + 8 <= hi && 2 * ow + 16 <= width; ow += 8) {
          const vec8::f8 v = vec8::load8(s + ow) + va;
          vec8::store8(row + 2 * ow, __builtin_shufflevector(v, vz, 0, 8, 1, 9, 2, 10, 3, 11));
          vec8::store8(row + 2 * ow + 8, __builtin_shufflevector(v, vz, 4, 12, 5, 13, 6, 14, 7, 15));
        }
        std::fill(row + 2 * ow, row + width, zero);
      } else {
        std::fill(row, row + width, zero);
      }
      for (; ow < hi; ++ow) row[ow * sw - left] = s[ow] + add;
    }
  }
  if (streamed || whole_lines) _mm_sfence();  // the streamed lines reach memory before another thread reads them
}

}  // namespace

bool pointwise_input_grad_applies(const Shape& x, const Shape& w, const Shape& y, const Conv2dParams& p) {
  return pointwise_conv_applies(x, w, y, p) && w[0] <= kPointwiseMaxOutChannels;
}

void pointwise_conv2d_backward_input(const Tensor& grad_input, const Tensor& grad_output, const Tensor& weight,
                                     const Tensor& bias, const Conv2dParams& p) {
  const Shape &x = grad_input.shape(), &y = grad_output.shape();
  const PointwiseGeometry g{x[1], x[2], x[3], y[1], y[2], y[3], p};
  const PointwiseTile t = pointwise_tile_for_this_cpu();
  float* packed_w = thread_scratch<float>(kPointwiseWeightSlot, size_t(row_panels(g, t) * g.out_channels * t.rows));
  pack_transposed_weight(g, t, weight.data_ptr<float>(), packed_w);
  const float* dyd = grad_output.data_ptr<float>();
  const float* bd = bias.defined() ? bias.data_ptr<float>() : nullptr;
  float* dxd = grad_input.data_ptr<float>();
  const int64_t tasks = tasks_per_image(g, t), rows = rows_per_task(g, t);
  const int64_t x_image = g.channels * g.height * g.width, y_image = g.out_channels * g.area();
  parallel_for(0, x[0] * tasks, 1, [&](int64_t t0, int64_t t1) {
    const int64_t tile_floats = row_panels(g, t) * t.rows * max_panels(g, t) * t.cols;
    float* tile = thread_scratch<float>(kPointwiseTaskSlot, size_t(tile_floats + g.out_channels * t.cols));
    float* edge = tile + tile_floats;
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t n = task / tasks, k = task % tasks;
      const int64_t oh0 = k * rows, oh1 = std::min(g.out_h, oh0 + rows);
      const int64_t col0 = oh0 * g.out_w, cols = (oh1 - oh0) * g.out_w, ld = (cols + t.cols - 1) / t.cols * t.cols;
      // The dX rows this task owns: from its first output row's input row to the next task's
      // (the first task from row 0, the last to the bottom).
      const auto input_row = [&](int64_t oh) {
        return std::clamp<int64_t>(oh * p.stride[0] - p.padding_begin[0], 0, g.height);
      };
      const int64_t ih0 = k == 0 ? 0 : input_row(oh0), ih1 = k == tasks - 1 ? g.height : input_row(oh1);
      const float* dy_n = dyd + n * y_image;
      float* dx_n = dxd + n * x_image;
      if (cols % t.cols) pack_edge_panel(g, t, dy_n, col0 + cols / t.cols * t.cols, cols % t.cols, edge);
      const int64_t next_oh0 = k + 1 == tasks ? 0 : oh1, next_n = k + 1 == tasks ? n + 1 : n;
      const int64_t next_cols = (std::min(g.out_h, next_oh0 + rows) - next_oh0) * g.out_w;
      const float* next = task + 1 < t1 ? dyd + next_n * y_image + next_oh0 * g.out_w : nullptr;
      multiply(g, t, packed_w, dy_n, col0, cols, edge, tile, next, next_cols);
      spread(g, tile, ld, oh0, ih0, ih1, bd, dx_n);
    }
  });
}

}  // namespace ember::cpu
