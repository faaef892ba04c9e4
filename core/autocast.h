// Automatic mixed precision (torch.autocast). Inside an AutocastGuard, ops on tensors of the
// guarded device follow a per-op policy:
//   lower precision: matmul, bmm, linear (so the attention products too) run in the autocast
//                    dtype (bf16 on CPU by default; f16 or bf16 on CUDA);
//   f32:             softmax, log_softmax, layer_norm, batch_norm, group_norm, rms_norm,
//                    cross_entropy, mse_loss and the reductions sum/mean/var compute in, and
//                    return, f32;
//   everything else runs in the dtype of its inputs (mixed inputs promote as usual).
// Parameters stay f32: a lower-precision copy of each leaf weight is made once per autocast
// region (cached until the region ends or the next backward) and its gradient flows back to
// the f32 parameter. Backward passes never autocast; they run in the dtypes of the forward.
#pragma once
#include "core/device.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace ember {

// The default autocast dtype of a device: bf16 on CPU, f16 on CUDA (as in PyTorch).
DType default_autocast_dtype(DeviceType device);

// Is autocast on for `device` on this thread, and with which dtype.
bool autocast_enabled(DeviceType device);
DType autocast_dtype(DeviceType device);

// Turns autocast on (or, with enabled = false, off) for one device type until destroyed;
// guards nest and restore what was there before. dtype must be f16 or bf16.
class AutocastGuard {
 public:
  explicit AutocastGuard(DeviceType device, DType dtype, bool enabled = true);
  explicit AutocastGuard(DeviceType device, bool enabled = true)
      : AutocastGuard(device, default_autocast_dtype(device), enabled) {}
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;
  AutocastGuard(AutocastGuard&& other) noexcept;
  AutocastGuard& operator=(AutocastGuard&&) = delete;

 private:
  DeviceType device_;
  bool prev_enabled_ = false;
  DType prev_dtype_ = DType::bf16;
  bool active_ = true;
};

namespace autocast {

// The casts the op policy applies (identity when autocast is off for x's device, x is not a
// floating-point tensor, or x already has the target dtype). Differentiable.
Tensor to_lower(const Tensor& x);  // f32 -> the autocast dtype (leaf weights cached)
Tensor to_f32(const Tensor& x);    // f16/bf16 -> f32
// True when autocast is on for x's device.
bool active_for(const Tensor& x);
// Drops the cached lower-precision weight copies (weights are about to change).
void clear_cache();
// Autocast state of this thread, saved and cleared for a backward pass and restored after.
class SuspendGuard {
 public:
  SuspendGuard();
  ~SuspendGuard();
  SuspendGuard(const SuspendGuard&) = delete;
  SuspendGuard& operator=(const SuspendGuard&) = delete;

 private:
  bool prev_cpu_, prev_cuda_;
};

}  // namespace autocast
}  // namespace ember
