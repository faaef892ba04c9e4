// Which kernel runs an f32 CPU convolution pass: Ember's im2col + GEMM (convolution.cpp, with
// its gathered-panel 1x1 case in convolution_pointwise.h), oneDNN 2.6's convolution primitive in
// its blocked layouts (convolution_onednn.cpp), reached from Ember's NCHW tensors through a
// reorder of each operand in and of the result out, or a direct kernel for one-channel layers
// (convolution_direct.h).
//
// Measured (bench/bench_conv.cpp, f32, one thread, GFLOP/s over CPU time, median of 5 runs;
// AMD EPYC Zen 3 AVX2, 2 cores on a host with noisy neighbours, +-15% from run to run): the path
// the choice below takes, against oneDNN's blocked kernels with the reorders counted
// ("reordered") and on tensors kept in its own layouts ("blocked", no reorders: out of reach of
// an NCHW framework on the 1x1 and first layers).
//
//   shape (N)                          pass        path     Ember  reordered  blocked
//   lenet c1 1->6 5x5 28x28 (64)       fwd         direct     64        17       23
//                                      bwd_data    gemm       21         5        5
//                                      bwd_weight  gemm       13         5        6
//   lenet c2 6->16 5x5 12x12 (64)      fwd         onednn     52        53       58
//                                      bwd_data    onednn     30        32       35
//                                      bwd_weight  onednn     42        43       44
//   fmnist c1 1->32 3x3 28x28 (128)    fwd         direct     44        23       56
//                                      bwd_data    gemm       42         6        7
//                                      bwd_weight  gemm       21         5        7
//   fmnist c2 32->64 3x3 14x14 (128)   fwd         onednn     63        66       71
//                                      bwd_data    onednn     75        68       79
//                                      bwd_weight  onednn     52        53       57
//   resnet 64->64 3x3 56x56 (8)        fwd         onednn     77        79       78
//                                      bwd_data    onednn     79        75       86
//                                      bwd_weight  gemm       54        43       46
//   resnet 64->128 1x1 s2 56x56 (8)    fwd         gemm       57        43       77
//                                      bwd_data    gemm       51        47       73
//                                      bwd_weight  gemm       58        42       67
//
// On the 3x3 first layer the direct kernel (shifted copies: no idle lanes on 28-wide rows)
// beats the GEMM (57 against 50 in alternating runs), both near the pace of writing the
// output. oneDNN's weight gradient loses to the GEMM from 64 channels (resnet 256->256: 57
// vs 85 on the GEMM), and the 1x1 layers go to the GEMM: their reorders cost more than
// oneDNN's kernels gain (the 1x1 weight gradient takes dot products along the positions,
// convolution_pointwise_weight.cpp).
//
// On an Intel Xeon with AVX-512 (family 6 model 207, 2 cores, measured FMA peak 193 GFLOP/s
// per core; oneDNN runs its AVX-512 kernels; the same benchmark, one thread, best of 3 runs
// alternating with the AVX2-era choice, GFLOP/s over CPU time):
//
//   shape (N)                          pass        path     Ember  reordered  blocked
//   lenet c1 1->6 5x5 28x28 (64)       fwd         direct     98        38       65
//                                      bwd_weight  direct     55        38       59
//   fmnist c1 1->32 3x3 28x28 (128)    fwd         direct     87        38      101
//                                      bwd_weight  direct     81        38      101
//   fmnist c2 32->64 3x3 14x14 (128)   fwd         onednn    176       170      205
//   resnet 64->64 3x3 56x56 (8)        bwd_weight  onednn    164       157      181
//   resnet 64->128 3x3 s2 (8)          bwd_weight  onednn    143       142      162
//   resnet 128->128 3x3 28x28 (8)      bwd_weight  onednn    179       177      189
//   resnet 256->256 3x3 14x14 (8)      bwd_weight  onednn    174       176      187
//   resnet 64->128 1x1 s2 56x56 (8)    fwd         gemm      118        73      149
//                                      bwd_data    gemm       98        67      123
//                                      bwd_weight  gemm      106        72      141
//
// There oneDNN's weight gradient leads the GEMM at every width (forced, the GEMM ran the
// 64->64, 128->128 and 256->256 weight gradients at 113, 134 and 150 against oneDNN's 149,
// 168 and 169), the direct kernel and the 1x1 kernels run 16 lanes wide
// (convolution_direct_avx512.cpp, convolution_pointwise_images.cpp,
// convolution_weight_dots_avx512.cpp), and a one-channel layer's weight gradient takes dot
// products along the positions of the direct kernel's shifted copies
// (convolution_direct_weight.cpp; the GEMM: 34 and 46). Every other pass is at 0.87 of the
// blocked layout or above; the 1x1 stride-2 layer's three passes (0.76-0.79) read and write
// NCHW rows, where oneDNN's blocked layout reads half the input lines and writes whole lines,
// and its weight gradient waits on reading dY and x from memory.
//
// Dispatch (conv_path_for): a forward convolution on a one-channel input with at least
// kDirectMinTaps taps (a 3x3 or 5x5 first layer) runs the direct kernel (convolution_direct.h),
// and with AVX-512 so does its weight gradient (direct_weight_grad_applies).
// Other passes go to oneDNN when each group has at least kOneDnnMinChannels input channels (oneDNN's
// blocked kernels block over channels; a 1-channel first layer leaves them mostly padding), the
// kernel is larger than 1x1 (a 1x1 convolution does too little work per element for the
// reorders to pay) and the batch has at least an image per thread (the oneDNN path splits the
// batch over Ember's threads); without AVX-512 the weight gradient only up to
// kOneDnnMaxWeightGradChannels channels per group (with more, the GEMM's long rows win). Only
// what a path supports goes there: oneDNN takes f32 (bf16/f16 run widened to f32), one group,
// no input-gradient bias (conv_transpose2d's), non-negative end padding, not a 1x1 stride-1
// convolution (its GEMM needs no im2col); the direct kernel the forward pass with one group,
// unit strides, at most kDirectMaxTaps taps and at least 8 output positions, and with AVX-512
// the weight gradient of the same convolutions with at least 16. EMBER_CONV_PATH=
// gemm|onednn|direct (or set_conv_path) forces one wherever it supports the case, the GEMM
// elsewhere.
#pragma once
#include <optional>

#include "core/native/convolution.h"

namespace ember::cpu {

enum class ConvPath { Gemm = 0, OneDnn = 1, Direct = 2 };
enum class ConvPass { Forward, BackwardInput, BackwardWeight };

// Input channels per group from which oneDNN's blocked kernels win (the table above).
inline constexpr int64_t kOneDnnMinChannels = 4;
// Input channels per group up to which oneDNN's weight gradient wins on AVX2 (above, the
// GEMM's); with AVX-512 it wins at every width.
inline constexpr int64_t kOneDnnMaxWeightGradChannels = 32;
// Taps from which the direct kernel beats the GEMM on a one-channel input (3x3 and up; fewer
// taps are untried).
inline constexpr int64_t kDirectMinTaps = 9;

const char* conv_path_name(ConvPath path);
// The path a pass takes: x [N, C, H, W], weight [O, C / groups, kH, kW], y [N, O, Ho, Wo] (the
// shapes of the forward convolution whatever the pass). An EMBER_CONV_PATH value other than gemm,
// onednn or direct is an ember::Error naming it.
ConvPath conv_path_for(ConvPass pass, const Shape& x, const Shape& weight, const Shape& y,
                       const native::Conv2dParams& params, bool has_bias);
// Forces one path wherever it supports the case, the GEMM elsewhere (tests, benchmarks);
// std::nullopt restores the automatic choice.
void set_conv_path(std::optional<ConvPath> path);

}  // namespace ember::cpu
