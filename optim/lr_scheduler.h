// Learning-rate schedules with warmup, as in Hugging Face transformers' get_scheduler: the
// multiplier of each group's initial lr is a function of the step count.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "optim/optimizer.h"

namespace ember::optim {

class LRScheduler {
 public:
  // factor(step) multiplies each group's initial lr; step starts at 0 and lr is set at once.
  LRScheduler(Optimizer& opt, std::function<double(int64_t)> factor);
  virtual ~LRScheduler() = default;
  void step();
  int64_t last_step() const { return step_; }
  std::vector<double> get_last_lr() const;
  std::map<std::string, double> state_dict() const { return {{"step", double(step_)}}; }
  // Restores the step (and sets the lr it gives); the dict is checked first, so a refused one
  // changes nothing.
  void load_state_dict(const std::map<std::string, double>& sd);
  // Raises ember::Error naming the key, changing nothing, unless `sd` holds exactly "step", a
  // non-negative integer.
  void validate_state_dict(const std::map<std::string, double>& sd) const;

 private:
  void apply();
  Optimizer& opt_;
  std::function<double(int64_t)> factor_;
  std::vector<double> base_lrs_;
  int64_t step_ = 0;
};

// name: "constant", "constant_with_warmup", "linear", "cosine", "polynomial".
std::unique_ptr<LRScheduler> get_scheduler(const std::string& name, Optimizer& opt, int64_t num_warmup_steps,
                                           int64_t num_training_steps, double lr_end = 1e-7, double power = 1.0);

// The schedule functions themselves (factor of the base lr at `step`).
double linear_warmup_decay(int64_t step, int64_t warmup, int64_t total);
double cosine_warmup_decay(int64_t step, int64_t warmup, int64_t total, double num_cycles = 0.5);
double polynomial_warmup_decay(int64_t step, int64_t warmup, int64_t total, double lr_init, double lr_end,
                               double power);
double constant_warmup(int64_t step, int64_t warmup);

}  // namespace ember::optim
