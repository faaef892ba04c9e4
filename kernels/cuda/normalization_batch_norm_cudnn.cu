// Batch norm on cuDNN: the two library stubs of core/native/normalization.h on cuDNN's batch
// normalisation calls cudnnBatchNormalizationForwardTraining, cudnnBatchNormalizationForwardInference
// and cudnnBatchNormalizationBackward (libcudnn_ops, reached through libcudnn). cuDNN 9 marks
// them deprecated in favour of the graph API's norm nodes but still ships them (9.19 included),
// and PyTorch's cuDNN batch norm is built on them.
//
// An input [n, c, s] (s the product of the spatial dims) is the packed NCHW tensor [n, c, s, 1]:
// spatial mode normalises each channel over N, H and W, which is over n and s. [N, C] input
// (s == 1) runs per-activation mode, which normalises each of the C x 1 x 1 activations over N:
// the same statistics, as PyTorch picks for 2-D input. The per-channel tensors share one
// descriptor cuDNN derives from x's (f32 for f16, bf16 and f32 input).
//
// cuDNN's running variance is the unbiased one, moved with exponentialAverageFactor as PyTorch's
// momentum: running = (1 - factor) * running + factor * batch. Its saved inverse variance is
// 1 / sqrt(biased variance + eps), the pieces' invstd.
//
// Declined (Ember's kernels run): the switch off, eps below CUDNN_BN_MIN_EPSILON, INT_MAX or more
// elements, batches beyond the sizes PyTorch limits cuDNN to per mode, and any call cuDNN answers
// with a CUDNN_STATUS_NOT_SUPPORTED* status (it has then written nothing).
#include <atomic>
#include <climits>
#include <cstdint>

#include "core/native/normalization.h"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/cuda/cudnn_backend.h"
#include "kernels/cuda/cudnn_batch_norm.h"

namespace ember {
namespace cuda {
namespace {

EnvSwitch cudnn_batch_norm_switch{"EMBER_CUDNN_BATCH_NORM", true};

std::atomic<int64_t> forward_training_calls{0}, forward_inference_calls{0}, backward_calls{0}, declined_calls{0};

// The largest batch per mode and pass that PyTorch hands to cuDNN (beyond it cuDNN failed).
constexpr int64_t kMaxBatchSpatialTraining = 880801, kMaxBatchSpatialInference = 65535;
constexpr int64_t kMaxBatchPerActivationTraining = 131070, kMaxBatchPerActivationInference = 262136;

class TensorDescriptor {
 public:
  TensorDescriptor() { EMBER_CUDNN_CHECK(cudnnCreateTensorDescriptor(&desc_)); }
  ~TensorDescriptor() { cudnnDestroyTensorDescriptor(desc_); }
  TensorDescriptor(const TensorDescriptor&) = delete;
  TensorDescriptor& operator=(const TensorDescriptor&) = delete;
  cudnnTensorDescriptor_t get() const { return desc_; }

 private:
  cudnnTensorDescriptor_t desc_ = nullptr;
};

cudnnBatchNormMode_t mode_for(const native::ChannelGeometry& g) {
  return g.s == 1 ? CUDNN_BATCHNORM_PER_ACTIVATION : CUDNN_BATCHNORM_SPATIAL;
}

// Whether cuDNN is asked at all: everything but its answer.
bool within_limits(const Tensor& x, const native::ChannelGeometry& g, bool training, double eps) {
  if (!cudnn_batch_norm_switch.get()) return false;
  if (x.dtype() != DType::f32 && x.dtype() != DType::f16 && x.dtype() != DType::bf16) return false;
  if (!(eps >= CUDNN_BN_MIN_EPSILON)) return false;
  if (x.numel() >= int64_t(INT_MAX)) return false;
  if (mode_for(g) == CUDNN_BATCHNORM_PER_ACTIVATION)
    return g.n <= (training ? kMaxBatchPerActivationTraining : kMaxBatchPerActivationInference);
  return g.n <= (training ? kMaxBatchSpatialTraining : kMaxBatchSpatialInference);
}

bool decline() {
  declined_calls.fetch_add(1);
  return false;
}

// x's descriptor (also y's, dy's and dx's) and the per-channel tensors' one derived from it.
struct Descriptors {
  TensorDescriptor x, channel;
  Descriptors(DType dtype, const native::ChannelGeometry& g) {
    EMBER_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x.get(), CUDNN_TENSOR_NCHW, cudnn_data_type(dtype, "batch_norm"),
                                                 int(g.n), int(g.c), int(g.s), 1));
    EMBER_CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(channel.get(), x.get(), mode_for(g)));
  }
};

void* data_or_null(const Tensor& t) { return t.defined() ? t.raw_data() : nullptr; }

// cuDNN's status, raised unless it is success or in the "not supported" category (a shape, a
// data type, this GPU's architecture...: the caller then declines).
bool succeeded(cudnnStatus_t status, const char* call) {
  if (status == CUDNN_STATUS_SUCCESS) return true;
  if (CUDNN_STATUS_CATEGORY(int(status)) == int(CUDNN_STATUS_NOT_SUPPORTED)) return false;
  raise_cudnn_error(status, call, __FILE__, __LINE__);
}

bool batch_norm_forward_cudnn(const Tensor& y, const Tensor& save_mean, const Tensor& save_invstd, const Tensor& x,
                              const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                              const Tensor& running_var, const native::ChannelGeometry& g, bool training,
                              double momentum, double eps) {
  if (!within_limits(x, g, training, eps)) return decline();
  DeviceGuard guard(x.device(), "batch_norm");
  const Descriptors d(x.dtype(), g);
  const float one = 1.0f, zero = 0.0f;  // y = 1 * result + 0 * y
  cudnnStatus_t status;
  if (training) {
    status = cudnnBatchNormalizationForwardTraining(
        cudnn_handle(), mode_for(g), &one, &zero, d.x.get(), x.raw_data(), d.x.get(), y.raw_data(), d.channel.get(),
        weight.raw_data(), bias.raw_data(), momentum, data_or_null(running_mean), data_or_null(running_var), eps,
        save_mean.raw_data(), save_invstd.raw_data());
    if (!succeeded(status, "cudnnBatchNormalizationForwardTraining")) return decline();
    forward_training_calls.fetch_add(1);
  } else {
    status = cudnnBatchNormalizationForwardInference(
        cudnn_handle(), mode_for(g), &one, &zero, d.x.get(), x.raw_data(), d.x.get(), y.raw_data(), d.channel.get(),
        weight.raw_data(), bias.raw_data(), running_mean.raw_data(), running_var.raw_data(), eps);
    if (!succeeded(status, "cudnnBatchNormalizationForwardInference")) return decline();
    forward_inference_calls.fetch_add(1);
  }
  return true;
}

bool batch_norm_backward_cudnn(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy,
                               const Tensor& x, const Tensor& weight, const Tensor& save_mean,
                               const Tensor& save_invstd, const native::ChannelGeometry& g, double eps) {
  if (!within_limits(x, g, true, eps)) return decline();
  DeviceGuard guard(x.device(), "batch_norm_backward");
  const Descriptors d(x.dtype(), g);
  const float one = 1.0f, zero = 0.0f;  // dx, dweight and dbias overwritten, not accumulated
  const cudnnStatus_t status = cudnnBatchNormalizationBackward(
      cudnn_handle(), mode_for(g), &one, &zero, &one, &zero, d.x.get(), x.raw_data(), d.x.get(), dy.raw_data(),
      d.x.get(), dx.raw_data(), d.channel.get(), weight.raw_data(), dweight.raw_data(), dbias.raw_data(), eps,
      save_mean.raw_data(), save_invstd.raw_data());
  if (!succeeded(status, "cudnnBatchNormalizationBackward")) return decline();
  backward_calls.fetch_add(1);
  return true;
}

}  // namespace

void set_cudnn_batch_norm(bool on) { cudnn_batch_norm_switch.set(on); }
bool cudnn_batch_norm() { return cudnn_batch_norm_switch.get(); }

CudnnBatchNormCounts cudnn_batch_norm_counts() {
  return {forward_training_calls.load(), forward_inference_calls.load(), backward_calls.load(), declined_calls.load()};
}

}  // namespace cuda

EMBER_REGISTER_KERNEL(native::batch_norm_library_forward_stub, CUDA, &cuda::batch_norm_forward_cudnn);
EMBER_REGISTER_KERNEL(native::batch_norm_library_backward_stub, CUDA, &cuda::batch_norm_backward_cudnn);

}  // namespace ember
