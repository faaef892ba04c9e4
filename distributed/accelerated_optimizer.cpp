#include "distributed/accelerated_optimizer.h"

#include "core/error.h"

namespace ember::distributed {

AcceleratedOptimizer::AcceleratedOptimizer(std::shared_ptr<optim::Optimizer> optimizer,
                                           std::shared_ptr<GradientState> gradient_state)
    : optimizer_(std::move(optimizer)), gradient_state_(std::move(gradient_state)) {
  EMBER_CHECK(optimizer_ != nullptr, "AcceleratedOptimizer: the optimizer is null");
  EMBER_CHECK(gradient_state_ != nullptr, "AcceleratedOptimizer: needs a GradientState");
}

void AcceleratedOptimizer::step() {
  if (!gradient_state_->sync_gradients()) return;
  optimizer_->step();
  step_was_skipped_ = false;
  ++num_updates_;
}

void AcceleratedOptimizer::zero_grad(bool set_to_none) {
  if (!gradient_state_->sync_gradients()) return;
  optimizer_->zero_grad(set_to_none);
}

}  // namespace ember::distributed
