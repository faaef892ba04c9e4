// The weight gradient of a convolution with few taps (a one-channel first layer), on AVX-512:
// dW[o][t] = sum over images and output positions p of dY[o][p] * x at tap t of p. Each image is
// copied as the direct forward kernel copies it, shifted per kernel column so that tap t's values
// for the output positions in order are one run of the copies (offsets[t] on), and the runs are
// multiplied against dY's rows as dot products along the positions
// (convolution_weight_dots_avx512.h). im2col + GEMM made a product with an inner dimension of a few
// hundred positions and a handful of columns, which the GEMM packs more than it multiplies: on
// Fashion-MNIST's 1->32 3x3 layer (N = 128, Intel Xeon family 6 model 207, one thread) 44 GFLOP/s,
// where this runs at 79 (LeNet's 1->6 5x5: 33 and 54).
#include <algorithm>
#include <vector>

#include "core/cpu_features.h"
#include "kernels/cpu/convolution_direct.h"
#include "kernels/cpu/convolution_direct_plan.h"
#include "kernels/cpu/convolution_weight_chunks.h"
#include "kernels/cpu/convolution_weight_dots_avx512.h"
#include "kernels/cpu/scratch.h"

namespace ember::cpu {
namespace {

// Scratch: the per-chunk partial dW (the caller's), each chunk's copies and interleaved runs.
constexpr int kPartialSlot = 0;
constexpr int kCopiesSlot = 1;
// Positions a group of images spans at least (as the pointwise weight gradient's groups).
constexpr int64_t kGroupPositions = 1024;

}  // namespace

bool direct_weight_grad_applies(const Shape& x, const Shape& w, const Shape& y, const native::Conv2dParams& p) {
  return cpu_capability() == CpuCapability::Avx512 && direct_conv_applies(x, w, y, p) && y[2] * y[3] >= 16;
}

void direct_conv2d_backward_weight(const Tensor& grad_weight, const Tensor& grad_output, const Tensor& input,
                                   const native::Conv2dParams& p) {
  const Shape &x = input.shape(), &w = grad_weight.shape(), &y = grad_output.shape();
  DirectGeometry g{x[1], x[2], x[3], w[0], w[2], w[3], y[2], y[3], p, 16, kDirectAvx512ChannelBlock};
  g.flat = true;
  const DirectPlan plan = direct_plan(g, nullptr);
  const WeightDots dots{g.out_channels, g.taps(), g.area()};
  const int64_t x_image = g.channels * g.height * g.width, dy_image = g.out_channels * g.area();
  const int64_t copies_image = g.channels * g.copies() * g.copy_size();
  const int64_t group = std::max<int64_t>(1, kGroupPositions / g.area());
  const float* dyd = grad_output.data_ptr<float>();
  const float* xd = input.data_ptr<float>();
  auto run_chunk = [&](int64_t n0, int64_t n1, float* acc) {
    const int64_t most = std::min(group, n1 - n0);
    float* copies =
        thread_scratch<float>(kCopiesSlot, size_t(most * copies_image + weight_dots_scratch_avx512(dots, most)));
    std::vector<const float*> rows(size_t(most * g.taps()));
    for (int64_t n = n0; n < n1; n += most) {
      const int64_t images = std::min(most, n1 - n);
      for (int64_t i = 0; i < images; ++i) {
        direct_copy_image(g, xd + (n + i) * x_image, copies + i * copies_image);
        for (int64_t t = 0; t < g.taps(); ++t)
          rows[size_t(i * g.taps() + t)] = copies + i * copies_image + plan.offsets[size_t(t)];
      }
      weight_dots_avx512(dots, dyd + n * dy_image, dy_image, rows.data(), images, copies + most * copies_image, acc);
    }
  };
  sum_weight_gradient_over_chunks(x[0], grad_weight.data_ptr<float>(), grad_weight.numel(), kPartialSlot, run_chunk);
}

}  // namespace ember::cpu
