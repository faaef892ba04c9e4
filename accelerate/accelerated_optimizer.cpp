#include "accelerate/accelerated_optimizer.h"

#include "core/error.h"

namespace ember::distributed {

AcceleratedOptimizer::AcceleratedOptimizer(std::shared_ptr<optim::Optimizer> optimizer,
                                           std::shared_ptr<GradientState> gradient_state,
                                           std::shared_ptr<optim::GradScaler> scaler)
    : optimizer_(std::move(optimizer)), gradient_state_(std::move(gradient_state)), scaler_(std::move(scaler)) {
  EMBER_CHECK(optimizer_ != nullptr, "AcceleratedOptimizer: the optimizer is null");
  EMBER_CHECK(gradient_state_ != nullptr, "AcceleratedOptimizer: needs a GradientState");
}

void AcceleratedOptimizer::step() {
  if (!gradient_state_->sync_gradients()) return;
  if (scaler_ == nullptr) {
    if (!stepped_in_backward_) optimizer_->step();
    step_was_skipped_ = false;
    ++num_updates_;
    if (after_step_) after_step_();
    return;
  }
  const bool stepped = scaler_->step(*optimizer_);
  // One scale update per iteration. While another optimizer sharing the scaler was unscaled
  // (by clipping) and has not stepped yet, its update waits for it: updating now would forget
  // that its gradients are unscaled already, and its step would unscale them a second time.
  if (!scaler_->awaiting_step()) scaler_->update();
  step_was_skipped_ = !stepped;
  if (stepped) ++num_updates_;
  if (after_step_) after_step_();
}

void AcceleratedOptimizer::zero_grad(bool set_to_none) {
  if (!gradient_state_->sync_gradients()) return;
  optimizer_->zero_grad(set_to_none);
}

}  // namespace ember::distributed
