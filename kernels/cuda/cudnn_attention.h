// The switch and the counters of attention on cuDNN (kernels/cuda/fused_attention_cudnn.cu).
// Off by default until its tests have passed on a device; EMBER_CUDNN_ATTENTION=1 or
// set_cudnn_attention(true) turns it on, and off every attention runs Ember's own kernels (or
// the composition the autograd layer picks for them).
#pragma once
#include <cstdint>

namespace ember::cuda {

void set_cudnn_attention(bool on);
bool cudnn_attention();

// The largest head dim handed to cuDNN (a multiple of 8; the flash-attention engines of every
// cuDNN 9 release and GPU since Ampere take up to 128).
inline constexpr int64_t kCudnnAttentionMaxHeadDim = 128;

// Passes this process ran on cuDNN, and problems handed back to Ember's kernels (switch off,
// outside the limits above, or refused by cuDNN), since it started.
struct CudnnAttentionCounts {
  int64_t forward = 0, backward = 0, declined = 0;
};
CudnnAttentionCounts cudnn_attention_counts();

}  // namespace ember::cuda
