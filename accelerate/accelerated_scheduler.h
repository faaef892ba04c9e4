// AcceleratedScheduler: the learning-rate scheduler Accelerator::prepare hands back, the twin of
// Accelerate's AcceleratedScheduler. The schedule is written for one process reading the
// un-prepared loader (num_training_steps = len(loader) * epochs / gradient_accumulation_steps),
// and the wrapper keeps it on time whatever the launch:
//
//   - step_with_optimizer (AcceleratorOptions::step_scheduler_with_optimizer, default on):
//       * on a micro-step that does not synchronise gradients, step() does nothing;
//       * when a prepared optimizer skipped its update (loss scaling), step() does nothing;
//       * otherwise it steps num_processes times (each process read 1/num_processes of the
//         batches the schedule was written for), or once with split_batches (the global batch
//         is the loader's batch, so the number of steps did not change).
//   - step_with_optimizer off: every call steps the schedule exactly once.
#pragma once
#include <memory>
#include <vector>

#include "accelerate/accelerated_optimizer.h"
#include "optim/lr_scheduler.h"

namespace ember::distributed {

class AcceleratedScheduler {
 public:
  AcceleratedScheduler(std::shared_ptr<optim::LRScheduler> scheduler,
                       std::vector<std::shared_ptr<AcceleratedOptimizer>> optimizers,
                       std::shared_ptr<GradientState> gradient_state, int num_processes, bool step_with_optimizer,
                       bool split_batches);

  void step();
  // Calls to step() so far, and steps the wrapped schedule actually took through them.
  int64_t num_calls() const { return calls_; }
  int64_t last_step() const { return scheduler_->last_step(); }
  std::vector<double> get_last_lr() const { return scheduler_->get_last_lr(); }
  std::map<std::string, double> state_dict() const { return scheduler_->state_dict(); }
  void load_state_dict(const std::map<std::string, double>& sd) { scheduler_->load_state_dict(sd); }
  void validate_state_dict(const std::map<std::string, double>& sd) const { scheduler_->validate_state_dict(sd); }

  optim::LRScheduler& scheduler() { return *scheduler_; }
  const optim::LRScheduler& scheduler() const { return *scheduler_; }

 private:
  std::shared_ptr<optim::LRScheduler> scheduler_;
  std::vector<std::shared_ptr<AcceleratedOptimizer>> optimizers_;
  std::shared_ptr<GradientState> gradient_state_;
  int num_processes_;
  bool step_with_optimizer_;
  bool split_batches_;
  int64_t calls_ = 0;
};

}  // namespace ember::distributed
