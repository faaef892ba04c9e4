// A convolution weight gradient as dot products along the output positions, on AVX-512:
//   dw [O, R] += sum over images n of dY_n [O, area] . X_n [R, area]^T,
// X_n's rows given one by one (a gathered 1x1 input's channels, a direct layer's taps read from
// shifted copies of the image). The sums are those of the AVX2 tile of
// convolution_pointwise_weight.cpp, bit for bit: each (o, r) pair sums its positions 8 lanes wide,
// chunk by chunk and image by image, then reduces the lanes the same way. Call only where
// cpu_capability() is CpuCapability::Avx512.
#pragma once
#include <cstdint>

namespace ember::cpu {

struct WeightDots {
  int64_t out_channels, rows, area;
};

// Floats of scratch weight_dots_avx512 needs for `images` images.
int64_t weight_dots_scratch_avx512(const WeightDots& d, int64_t images);
// dw (row stride d.rows) += the sums over `images` images: dY_n at dy + n * dy_image (rows d.area
// apart), X_n's row r at rows[n * d.rows + r] (d.area floats).
void weight_dots_avx512(const WeightDots& d, const float* dy, int64_t dy_image, const float* const* rows,
                        int64_t images, float* scratch, float* dw);

}  // namespace ember::cpu
