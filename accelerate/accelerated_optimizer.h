// AcceleratedOptimizer: the optimizer Accelerator::prepare hands back, the twin of Accelerate's
// AcceleratedOptimizer. Under gradient accumulation step() and zero_grad() act only on the
// micro-step that synchronises gradients (GradientState::sync_gradients), so the loop body stays
// the single-device one:
//
//   for (auto& batch : *loader) {
//     auto guard = acc.accumulate(model);
//     acc.backward(loss(batch));
//     opt->step();        // updates every K-th micro-step (and at the end of the epoch)
//     sched->step();
//     opt->zero_grad();   // likewise: gradients keep accumulating in between
//   }
//
// With a loss scaler (mixed_precision "fp16") a synchronising step() is the scaler's step
// (unscale unless clipping did already, skip the update when a gradient is inf/NaN) followed
// by its update(). step_was_skipped() reports an update the scaler refused; the scheduler then
// does not step either. Without a scaler no step is skipped.
#pragma once
#include <functional>
#include <memory>

#include "accelerate/accelerator_state.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"

namespace ember::distributed {

class AcceleratedOptimizer {
 public:
  // `scaler` (may be null) is shared by every optimizer of the Accelerator.
  AcceleratedOptimizer(std::shared_ptr<optim::Optimizer> optimizer, std::shared_ptr<GradientState> gradient_state,
                       std::shared_ptr<optim::GradScaler> scaler = nullptr);

  // The wrapped optimizer's step (through the loss scaler, if any), on synchronising
  // micro-steps only.
  void step();
  // The wrapped optimizer's zero_grad, on synchronising micro-steps only.
  void zero_grad(bool set_to_none = true);

  // True when the last synchronising step() did not update (its gradients were not finite
  // under loss scaling).
  bool step_was_skipped() const { return step_was_skipped_; }
  // Optimizer updates actually made through this wrapper.
  int64_t num_updates() const { return num_updates_; }

  std::vector<optim::ParamGroup>& param_groups() { return optimizer_->param_groups(); }
  const std::vector<optim::ParamGroup>& param_groups() const { return optimizer_->param_groups(); }
  optim::OptimizerStateDict state_dict() const { return optimizer_->state_dict(); }
  void load_state_dict(const optim::OptimizerStateDict& sd) { optimizer_->load_state_dict(sd); }
  void validate_state_dict(const optim::OptimizerStateDict& sd) const { optimizer_->validate_state_dict(sd); }

  optim::Optimizer& optimizer() { return *optimizer_; }
  const optim::Optimizer& optimizer() const { return *optimizer_; }
  optim::Optimizer* operator->() { return optimizer_.get(); }
  // The loss scaler steps go through (nullptr without fp16).
  optim::GradScaler* scaler() const { return scaler_.get(); }
  // The wrapped optimizer is stepped by DDP during backward (AcceleratorOptions::
  // overlap_optimizer_step): step() only counts the update and runs the after-step work.
  void set_stepped_in_backward(bool on) { stepped_in_backward_ = on; }
  bool stepped_in_backward() const { return stepped_in_backward_; }
  // Runs after every synchronising step() (updated or skipped): sharded models gather there.
  void set_after_step(std::function<void()> fn) { after_step_ = std::move(fn); }

 private:
  std::shared_ptr<optim::Optimizer> optimizer_;
  std::shared_ptr<GradientState> gradient_state_;
  std::shared_ptr<optim::GradScaler> scaler_;
  std::function<void()> after_step_;
  bool step_was_skipped_ = false;
  bool stepped_in_backward_ = false;
  int64_t num_updates_ = 0;
};

}  // namespace ember::distributed
