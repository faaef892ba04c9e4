// The forward of a gathered 1x1 convolution an image at a time, on the AVX-512 tile
// (convolution_pointwise.h): each image's input is gathered whole into rows of output positions
// (gather_position_rows: one forward walk over the image's rows), and the micro-kernel
// multiplies the weight into it in place, panel by panel, while the next image's rows are asked
// into L2, where the AVX2 path's tasks of 128 positions gather each channel's short row pieces
// into panels (about 100 row pieces in flight per task). On the ResNet-18 64->128 1x1 stride-2
// layer (N = 8, Intel Xeon family 6 model 207, one thread): 71 GFLOP/s on the AVX2 path, 103
// this way with ordinary stores, 115 with outputs past 1 MiB written past the cache.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "core/parallel.h"
#include "kernels/cpu/convolution_pointwise.h"
#include "kernels/cpu/convolution_pointwise_gather.h"
#include "kernels/cpu/scratch.h"

namespace ember::cpu {
namespace {

using native::Conv2dParams;

// Output size from which the full tiles' stores go past the cache (about an L2): y is then the
// pass's largest stream to memory, and ordinary stores first fetched every line they overwrite.
constexpr int64_t kStreamMinBytes = int64_t(1) << 20;

int64_t row_panels(const PointwiseGeometry& g, const PointwiseTile& t) {
  return (g.out_channels + t.rows - 1) / t.rows;
}

// Gathered rows padded to whole panels, so every panel is read in place.
int64_t padded_area(const PointwiseGeometry& g, const PointwiseTile& t) {
  return (g.area() + t.cols - 1) / t.cols * t.cols;
}

// Column panels [q0, q1) of one image's y [O, Ho*Wo] from its gathered rows xs (ld apart); between
// micro-kernel calls a share of the next image's rows (next_x, or none when null) is asked for.
// `streamed`: full tiles written past the cache (y 64-byte aligned, area a multiple of 16).
void multiply_panels(const PointwiseGeometry& g, const PointwiseTile& t, const float* packed_w, const float* xs,
                     int64_t ld, const float* bias, float* y, int64_t q0, int64_t q1, const float* next_x,
                     bool streamed) {
  alignas(64) float tile[kPackedAvx512Rows * kPackedAvx512Cols];
  const int64_t area = g.area(), weight_panels = row_panels(g, t);
  for (int64_t q = q0; q < q1; ++q) {
    const int64_t width = std::min(t.cols, area - q * t.cols);
    for (int64_t r = 0; r < weight_panels; ++r) {
      if (next_x) prefetch_position_rows(g, next_x, (q - q0) * weight_panels + r, (q1 - q0) * weight_panels);
      const int64_t rows = std::min(t.rows, g.out_channels - r * t.rows);
      float* c = y + r * t.rows * area + q * t.cols;
      // A last panel of 4 or 8 rows on AVX-512 runs the tile's first rows only, straight into y.
      const bool full = rows == t.rows_for(rows) && width == t.cols;
      (full && streamed ? t.streamed_for(rows) : t.strided_for(rows))(
          g.channels, packed_w + r * g.channels * t.rows, xs + q * t.cols, ld, full ? c : tile, full ? area : t.cols,
          1.0f, 0.0f);
      if (!full)
        for (int64_t i = 0; i < rows; ++i) std::copy(tile + i * t.cols, tile + i * t.cols + width, c + i * area);
      if (bias)
        for (int64_t i = 0; i < rows; ++i)
          for (float* v = c + i * area; v != c + i * area + width; ++v) *v += bias[r * t.rows + i];
    }
  }
  if (streamed)
    _mm_sfence();  // the streamed lines reach memory before another thread reads
                   // them
}

}  // namespace

void pointwise_conv2d_by_images(const Tensor& out, const Tensor& input, const Tensor& weight, const Tensor& bias,
                                const Conv2dParams& p) {
  const Shape &x = input.shape(), &y = out.shape();
  const PointwiseGeometry g{x[1], x[2], x[3], y[1], y[2], y[3], p};
  const PointwiseTile t = pointwise_tile_for_this_cpu();
  float* packed_w = thread_scratch<float>(kPointwiseWeightSlot, size_t(row_panels(g, t) * g.channels * t.rows));
  pack_pointwise_weight(g, t.rows, weight.data_ptr<float>(), packed_w);
  const float* xd = input.data_ptr<float>();
  const float* bd = bias.defined() ? bias.data_ptr<float>() : nullptr;
  float* yd = out.data_ptr<float>();
  const int64_t batch = x[0], x_image = g.channels * g.height * g.width, y_image = g.out_channels * g.area();
  const int64_t ld = padded_area(g, t), panels = ld / t.cols;
  const bool streamed = t.streamed && g.area() % 16 == 0 && reinterpret_cast<uintptr_t>(yd) % 64 == 0 &&
                        batch * y_image * int64_t(sizeof(float)) >= kStreamMinBytes;
  // Images split over the threads; a batch smaller than the pool splits each image's channels (the
  // gather) and panels (the multiply) instead.
  if (batch >= get_num_threads()) {
    parallel_for(0, batch, 1, [&](int64_t n0, int64_t n1) {
      float* xs = thread_scratch<float>(kPointwiseTaskSlot, size_t(g.channels * ld));
      for (int64_t n = n0; n < n1; ++n) {
        gather_position_rows(g, xd + n * x_image, 0, g.channels, xs, ld, true);
        multiply_panels(g, t, packed_w, xs, ld, bd, yd + n * y_image, 0, panels,
                        n + 1 < n1 ? xd + (n + 1) * x_image : nullptr, streamed);
      }
    });
    return;
  }
  float* xs = thread_scratch<float>(kPointwiseTaskSlot, size_t(g.channels * ld));
  for (int64_t n = 0; n < batch; ++n) {
    parallel_for(0, g.channels, 1,
                 [&](int64_t c0, int64_t c1) { gather_position_rows(g, xd + n * x_image, c0, c1, xs, ld, true); });
    parallel_for(0, panels, 1, [&](int64_t q0, int64_t q1) {
      multiply_panels(g, t, packed_w, xs, ld, bd, yd + n * y_image, q0, q1, nullptr, streamed);
    });
  }
}

}  // namespace ember::cpu
