// The switch and the counters of batch norm on cuDNN (kernels/cuda/normalization_batch_norm_cudnn.cu).
// On by default; EMBER_CUDNN_BATCH_NORM=0 or set_cudnn_batch_norm(false) makes every batch norm
// run Ember's own kernels (core/native/normalization.h's pieces), as a synchronised batch norm
// always does.
#pragma once
#include <cstdint>

namespace ember::cuda {

void set_cudnn_batch_norm(bool on);
bool cudnn_batch_norm();

// Calls this process made to cuDNN, and problems handed back to Ember's kernels (switch off,
// outside cuDNN's limits, or answered CUDNN_STATUS_NOT_SUPPORTED), since it started.
struct CudnnBatchNormCounts {
  int64_t forward_training = 0, forward_inference = 0, backward = 0, declined = 0;
};
CudnnBatchNormCounts cudnn_batch_norm_counts();

}  // namespace ember::cuda
