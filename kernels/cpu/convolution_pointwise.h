// The f32 forward pass of a 1x1 convolution that im2col would have to gather (a stride or
// padding): y[n] [O, Ho*Wo] = W [O, C] @ x[n] gathered to [C, Ho*Wo], with the gathered operand
// written straight into the packed GEMM's 16-column panels (gemm_packed.h) and multiplied there
// by its AVX2 micro-kernel. The im2col path writes the gathered columns once and the GEMM packs
// them again; on a stride-2 1x1 layer those two copies cost a third of the multiply. With
// AVX-512 the forward gathers an image at a time into rows the AVX-512 micro-kernel reads in
// place (convolution_pointwise_images.cpp). The weight gradient
// (convolution_pointwise_weight.cpp) gathers each image into rows of positions and takes dot
// products along them; the input gradient (convolution_pointwise_input.cpp) multiplies a few
// output rows at a time into a compact tile and spreads it into dX. Every pass gives the same
// bits with AVX2 and with AVX-512. Part of the GEMM path (convolution.cpp calls it for f32
// where it applies).
#pragma once
#include <algorithm>

#include "core/native/convolution.h"
#include "kernels/cpu/gemm_packed.h"

namespace ember::cpu {

// Input channels up to which one panel of the gathered operand covers them all (the packed
// GEMM's inner-dimension block).
inline constexpr int64_t kPointwiseMaxChannels = 256;
// Output channels up to which the input gradient's panels (one per 16 positions, all output
// channels deep) stay in L1/L2; past them the GEMM path's blocking serves better.
inline constexpr int64_t kPointwiseMaxOutChannels = 512;

// Output positions one task of the forward and input-gradient kernels takes: 8 of the AVX2
// micro-kernel's 16-column panels (4 of the AVX-512 kernel's 32), a few tens of KiB at 64
// channels, in L1/L2 while every row panel of the weight passes over them.
inline constexpr int64_t kPointwiseTaskCols = 8 * kPackedAvx2Cols;

// The micro-kernel tile the kernels multiply with (gemm_packed.h): AVX-512's 12 x 32 where
// packed_kernel_for_this_cpu() is Avx512, else AVX2's 6 x 16. Both compute every entry by the same
// chain of FMAs, so either gives the same bits. `streamed` (AVX-512 only, else null) is `strided`
// writing C past the cache.
struct PointwiseTile {
  using Strided = void (*)(int64_t kc, const float* a, const float* b, int64_t ldb, float* c, int64_t ldc, float alpha,
                           float beta);
  int64_t rows, cols;
  PackedMicroKernel packed;
  Strided strided, streamed;
  // AVX-512 only (else null): the tiles' first 4 and 8 rows, for a last row panel of that few.
  Strided strided_part[2] = {}, streamed_part[2] = {};
  // The rows the kernels for a panel of `panel_rows` rows compute (at least panel_rows, at most rows).
  int64_t rows_for(int64_t panel_rows) const {
    return strided_part[0] && panel_rows <= 4 ? 4 : strided_part[1] && panel_rows <= 8 ? 8 : rows;
  }
  Strided strided_for(int64_t panel_rows) const {
    return rows_for(panel_rows) == rows ? strided : strided_part[rows_for(panel_rows) / 4 - 1];
  }
  Strided streamed_for(int64_t panel_rows) const {
    return rows_for(panel_rows) == rows ? streamed : streamed_part[rows_for(panel_rows) / 4 - 1];
  }
};
PointwiseTile pointwise_tile_for_this_cpu();

// Their scratch slots (scratch.h): the caller's packed weight, and each task's buffers.
inline constexpr int kPointwiseWeightSlot = 2;
inline constexpr int kPointwiseTaskSlot = 3;

// The sizes of a gathered 1x1 convolution (x [N, C, H, W], y [N, O, Ho, Wo]), shared by its
// kernels.
struct PointwiseGeometry {
  int64_t channels, height, width, out_channels, out_h, out_w;
  native::Conv2dParams p;
  int64_t area() const { return out_h * out_w; }
  // The output columns [first_inside, end_inside) whose input column ow * stride - left lies
  // inside the image.
  int64_t first_inside() const {
    return std::min(out_w, (p.padding_begin[1] + p.stride[1] - 1) / p.stride[1]);
  }
  int64_t end_inside() const {
    return std::clamp<int64_t>((width - 1 + p.padding_begin[1]) / p.stride[1] + 1, first_inside(), out_w);
  }
};

// W [O, C] as row panels of `rows` output channels: panel r holds packed[(r * C + p) * rows + i] =
// W[r * rows + i][p], zero past O.
void pack_pointwise_weight(const PointwiseGeometry& g, int64_t rows, const float* w, float* packed);

// A 1x1 convolution with one group, at most kPointwiseMaxChannels input channels, a stride or
// padding other than 0 (without either it needs no gather) and a non-empty result.
bool pointwise_conv_applies(const Shape& x, const Shape& w, const Shape& y, const native::Conv2dParams& params);
// conv2d_stub's contract, f32, where pointwise_conv_applies.
void pointwise_conv2d(const Tensor& out, const Tensor& input, const Tensor& weight, const Tensor& bias,
                      const native::Conv2dParams& params);
// The same an image at a time (convolution_pointwise_images.cpp), what pointwise_conv2d runs where
// packed_kernel_for_this_cpu() is Avx512.
void pointwise_conv2d_by_images(const Tensor& out, const Tensor& input, const Tensor& weight, const Tensor& bias,
                                const native::Conv2dParams& params);
// Where the input gradient runs here: pointwise_conv_applies and at most
// kPointwiseMaxOutChannels output channels.
bool pointwise_input_grad_applies(const Shape& x, const Shape& w, const Shape& y, const native::Conv2dParams& params);
// conv2d_backward_input_stub's contract (bias optional), f32, where pointwise_input_grad_applies.
void pointwise_conv2d_backward_input(const Tensor& grad_input, const Tensor& grad_output, const Tensor& weight,
                                     const Tensor& bias, const native::Conv2dParams& params);
// conv2d_backward_weight_stub's contract, f32, where pointwise_conv_applies: the gathered
// input's rows against dY's, dot products along the output positions.
void pointwise_conv2d_backward_weight(const Tensor& grad_weight, const Tensor& grad_output, const Tensor& input,
                                      const native::Conv2dParams& params);

}  // namespace ember::cpu
