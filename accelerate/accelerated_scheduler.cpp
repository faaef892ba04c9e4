#include "accelerate/accelerated_scheduler.h"

#include "core/error.h"

namespace ember::distributed {

AcceleratedScheduler::AcceleratedScheduler(std::shared_ptr<optim::LRScheduler> scheduler,
                                           std::vector<std::shared_ptr<AcceleratedOptimizer>> optimizers,
                                           std::shared_ptr<GradientState> gradient_state, int num_processes,
                                           bool step_with_optimizer, bool split_batches)
    : scheduler_(std::move(scheduler)), optimizers_(std::move(optimizers)),
      gradient_state_(std::move(gradient_state)), num_processes_(num_processes),
      step_with_optimizer_(step_with_optimizer), split_batches_(split_batches) {
  EMBER_CHECK(scheduler_ != nullptr, "AcceleratedScheduler: the scheduler is null");
  EMBER_CHECK(gradient_state_ != nullptr, "AcceleratedScheduler: needs a GradientState");
  EMBER_CHECK(num_processes_ >= 1, "AcceleratedScheduler: num_processes must be >= 1, got ", num_processes_);
}

void AcceleratedScheduler::step() {
  ++calls_;
  if (!step_with_optimizer_) {
    scheduler_->step();
    return;
  }
  if (!gradient_state_->sync_gradients()) return;
  for (const auto& opt : optimizers_)
    if (opt->step_was_skipped()) return;
  const int times = split_batches_ ? 1 : num_processes_;
  for (int i = 0; i < times; ++i) scheduler_->step();
}

}  // namespace ember::distributed
