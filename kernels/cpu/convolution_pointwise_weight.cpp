// The weight gradient of a gathered 1x1 convolution (convolution_pointwise.h):
// dW [O, C] = sum over images n and output positions p of dY_n[o][p] * x_n[c][where p reads].
// Each image's gathered input is compacted into rows of positions (Xs [C, P], zero in the
// padding), and the product runs as dot products along the positions: a tile of 4 output by 3
// input channels keeps 12 vector sums in registers and reads dY's rows where they lie, so
// neither operand is transposed into panels (that packing, scalar and strided, was a third of
// the time on a stride-2 layer). Images with few positions are taken a group at a time, the
// tile summing the whole group before its one horizontal reduction. With AVX-512 the same sums
// run 16 lanes at a time (convolution_weight_dots_avx512.h), bit for bit.
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "core/cpu_features.h"
#include "kernels/cpu/convolution_pointwise.h"
#include "kernels/cpu/convolution_pointwise_gather.h"
#include "kernels/cpu/convolution_weight_chunks.h"
#include "kernels/cpu/convolution_weight_dots_avx512.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/vec8.h"

namespace ember::cpu {
namespace {

using native::Conv2dParams;
using vec8::f8;

// Scratch: the per-chunk partial dW (sum_weight_gradient_over_chunks), each chunk's Xs.
constexpr int kPartialSlot = 2;
constexpr int kGatheredSlot = 3;
// The register tile: output channels by input channels.
constexpr int kTileO = 4;
constexpr int kTileC = 3;
// Positions a group of images spans at least, so a tile's reduction is a few percent of it.
constexpr int64_t kGroupPositions = 1024;
// Xs's row stride: whole vectors, the tail zero.
int64_t row_stride(const PointwiseGeometry& g) { return (g.area() + vec8::kLanes - 1) / vec8::kLanes * vec8::kLanes; }

// The lanes of four sums as one vector of their totals: (sum a, sum b, sum c, sum d).
__m128 reduce4(f8 a, f8 b, f8 c, f8 d) {
  const __m256 ab = _mm256_hadd_ps(__m256(a), __m256(b)), cd = _mm256_hadd_ps(__m256(c), __m256(d));
  const __m256 abcd = _mm256_hadd_ps(ab, cd);
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

// dw[o0 + i][c0 + j] += sum over the group's images and positions of dY[o][p] * Xs[c][p], for
// i < OB, j < CB. dY's last partial vector is loaded under a mask: past it lies the next row
// (or the end of the tensor), which may hold anything.
template <int OB, int CB>
void tile(const PointwiseGeometry& g, const float* dy, int64_t dy_image, const float* xs, int64_t images, int64_t o0,
          int64_t c0, float* dw) {
  const int64_t area = g.area(), row = row_stride(g), full = area / vec8::kLanes * vec8::kLanes;
  const int64_t xs_image = g.channels * row;
  alignas(32) int32_t mask_lanes[vec8::kLanes];
  for (int k = 0; k < vec8::kLanes; ++k) mask_lanes[k] = k < area - full ? -1 : 0;
  const __m256i mask = _mm256_load_si256(reinterpret_cast<const __m256i*>(mask_lanes));
  f8 acc[OB][CB];
  for (int i = 0; i < OB; ++i)
    for (int j = 0; j < CB; ++j) acc[i][j] = f8{};
  for (int64_t n = 0; n < images; ++n) {
    const float* y = dy + n * dy_image + o0 * area;
    const float* x = xs + n * xs_image + c0 * row;
    for (int64_t k = 0; k < full; k += vec8::kLanes) {
      f8 xv[CB];
      for (int j = 0; j < CB; ++j) xv[j] = vec8::load8(x + j * row + k);
      for (int i = 0; i < OB; ++i) {
        const f8 yv = vec8::load8(y + i * area + k);
        for (int j = 0; j < CB; ++j) acc[i][j] += yv * xv[j];
      }
    }
    if (full < area)
      for (int i = 0; i < OB; ++i) {
        const f8 yv = f8(_mm256_maskload_ps(y + i * area + full, mask));
        for (int j = 0; j < CB; ++j) acc[i][j] += yv * vec8::load8(x + j * row + full);
      }
  }
  for (int j = 0; j < CB; ++j) {
    f8 col[kTileO];
    for (int i = 0; i < kTileO; ++i) col[i] = i < OB ? acc[i < OB ? i : 0][j] : f8{};
    alignas(16) float sums[4];
    _mm_store_ps(sums, reduce4(col[0], col[1], col[2], col[3]));
    for (int i = 0; i < OB; ++i) dw[(o0 + i) * g.channels + c0 + j] += sums[i];
  }
}

template <int OB>
void tile_row(int cb, const PointwiseGeometry& g, const float* dy, int64_t dy_image, const float* xs, int64_t images,
              int64_t o0, int64_t c0, float* dw) {
  switch (cb) {
    case 1: return tile<OB, 1>(g, dy, dy_image, xs, images, o0, c0, dw);
    case 2: return tile<OB, 2>(g, dy, dy_image, xs, images, o0, c0, dw);
    default: return tile<OB, kTileC>(g, dy, dy_image, xs, images, o0, c0, dw);
  }
}

// dw += the gradient of `images` consecutive images (dY and x at their first), Xs gathered
// into xs.
void accumulate_group(const PointwiseGeometry& g, const float* dy, const float* x, int64_t images, float* xs,
                      float* dw) {
  const int64_t x_image = g.channels * g.height * g.width, dy_image = g.out_channels * g.area();
  for (int64_t n = 0; n < images; ++n)
    gather_position_rows(g, x + n * x_image, 0, g.channels, xs + n * g.channels * row_stride(g), row_stride(g));
  for (int64_t o0 = 0; o0 < g.out_channels; o0 += kTileO)
    for (int64_t c0 = 0; c0 < g.channels; c0 += kTileC) {
      const int cb = int(std::min<int64_t>(kTileC, g.channels - c0));
      switch (std::min<int64_t>(kTileO, g.out_channels - o0)) {
        case 1: tile_row<1>(cb, g, dy, dy_image, xs, images, o0, c0, dw); break;
        case 2: tile_row<2>(cb, g, dy, dy_image, xs, images, o0, c0, dw); break;
        case 3: tile_row<3>(cb, g, dy, dy_image, xs, images, o0, c0, dw); break;
        default: tile_row<kTileO>(cb, g, dy, dy_image, xs, images, o0, c0, dw); break;
      }
    }
}

}  // namespace

void pointwise_conv2d_backward_weight(const Tensor& grad_weight, const Tensor& grad_output, const Tensor& input,
                                      const Conv2dParams& p) {
  const Shape &x = input.shape(), &y = grad_output.shape();
  const PointwiseGeometry g{x[1], x[2], x[3], y[1], y[2], y[3], p};
  const int64_t x_image = g.channels * g.height * g.width, dy_image = g.out_channels * g.area();
  const int64_t group = std::max<int64_t>(1, kGroupPositions / g.area());
  const float* dyd = grad_output.data_ptr<float>();
  const float* xd = input.data_ptr<float>();
  // On AVX-512: the rows gathered 16 lanes at a time, the same sums on 16-lane tiles.
  const bool avx512 = cpu_capability() == CpuCapability::Avx512;
  const WeightDots dots{g.out_channels, g.channels, g.area()};
  auto run_chunk = [&](int64_t n0, int64_t n1, float* acc) {
    const int64_t most = std::min(group, n1 - n0), gathered = most * g.channels * row_stride(g);
    float* xs =
        thread_scratch<float>(kGatheredSlot, size_t(gathered + (avx512 ? weight_dots_scratch_avx512(dots, most) : 0)));
    std::vector<const float*> rows(avx512 ? size_t(most * g.channels) : 0);
    for (int64_t n = n0; n < n1; n += most) {
      const int64_t images = std::min(most, n1 - n);
      if (!avx512) {
        accumulate_group(g, dyd + n * dy_image, xd + n * x_image, images, xs, acc);
        continue;
      }
      for (int64_t i = 0; i < images; ++i) {
        float* image_rows = xs + i * g.channels * row_stride(g);
        gather_position_rows(g, xd + (n + i) * x_image, 0, g.channels, image_rows, row_stride(g), true);
        for (int64_t c = 0; c < g.channels; ++c) rows[size_t(i * g.channels + c)] = image_rows + c * row_stride(g);
      }
      weight_dots_avx512(dots, dyd + n * dy_image, dy_image, rows.data(), images, xs + gathered, acc);
    }
  };
  sum_weight_gradient_over_chunks(x[0], grad_weight.data_ptr<float>(), grad_weight.numel(), kPartialSlot, run_chunk);
}

}  // namespace ember::cpu
