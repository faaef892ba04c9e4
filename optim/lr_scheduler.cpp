#include "optim/lr_scheduler.h"

#include <algorithm>
#include <cmath>

namespace ember::optim {

LRScheduler::LRScheduler(Optimizer& opt, std::function<double(int64_t)> factor)
    : opt_(opt), factor_(std::move(factor)) {
  for (auto& g : opt_.param_groups()) {
    auto it = g.options.find("initial_lr");
    base_lrs_.push_back(it != g.options.end() ? it->second : g.lr());
  }
  apply();
}

void LRScheduler::apply() {
  auto& groups = opt_.param_groups();
  for (size_t i = 0; i < groups.size(); ++i) groups[i].lr() = base_lrs_[i] * factor_(step_);
}

void LRScheduler::step() {
  ++step_;
  apply();
}

std::vector<double> LRScheduler::get_last_lr() const {
  std::vector<double> out;
  for (const auto& g : opt_.param_groups()) out.push_back(g.get("lr"));
  return out;
}

void LRScheduler::validate_state_dict(const std::map<std::string, double>& sd) const {
  for (const auto& [k, v] : sd)
    EMBER_CHECK(k == "step", "LRScheduler.load_state_dict: unexpected key '", k, "' (the state is 'step' only)");
  auto it = sd.find("step");
  EMBER_CHECK(it != sd.end(), "LRScheduler.load_state_dict: missing 'step'");
  const double step = it->second;
  EMBER_CHECK(std::isfinite(step) && step >= 0 && step == std::floor(step) && step < 9.0e15,
              "LRScheduler.load_state_dict: 'step' is ", step, ", expected a non-negative integer");
}

void LRScheduler::load_state_dict(const std::map<std::string, double>& sd) {
  validate_state_dict(sd);
  step_ = int64_t(sd.at("step"));
  apply();
}

double constant_warmup(int64_t step, int64_t warmup) {
  return step < warmup ? double(step) / double(std::max<int64_t>(1, warmup)) : 1.0;
}

double linear_warmup_decay(int64_t step, int64_t warmup, int64_t total) {
  if (step < warmup) return double(step) / double(std::max<int64_t>(1, warmup));
  return std::max(0.0, double(total - step) / double(std::max<int64_t>(1, total - warmup)));
}

double cosine_warmup_decay(int64_t step, int64_t warmup, int64_t total, double num_cycles) {
  if (step < warmup) return double(step) / double(std::max<int64_t>(1, warmup));
  const double progress = double(step - warmup) / double(std::max<int64_t>(1, total - warmup));
  return std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * num_cycles * 2.0 * progress)));
}

double polynomial_warmup_decay(int64_t step, int64_t warmup, int64_t total, double lr_init, double lr_end,
                               double power) {
  if (step < warmup) return double(step) / double(std::max<int64_t>(1, warmup));
  if (step > total) return lr_end / lr_init;
  const double remaining = 1.0 - double(step - warmup) / double(std::max<int64_t>(1, total - warmup));
  return ((lr_init - lr_end) * std::pow(remaining, power) + lr_end) / lr_init;
}

std::unique_ptr<LRScheduler> get_scheduler(const std::string& name, Optimizer& opt, int64_t warmup, int64_t total,
                                           double lr_end, double power) {
  EMBER_CHECK(warmup >= 0 && total >= 0, "get_scheduler: negative step counts (warmup ", warmup, ", total ", total, ")");
  if (name == "constant") return std::make_unique<LRScheduler>(opt, [](int64_t) { return 1.0; });
  if (name == "constant_with_warmup")
    return std::make_unique<LRScheduler>(opt, [=](int64_t s) { return constant_warmup(s, warmup); });
  if (name == "linear")
    return std::make_unique<LRScheduler>(opt, [=](int64_t s) { return linear_warmup_decay(s, warmup, total); });
  if (name == "cosine")
    return std::make_unique<LRScheduler>(opt, [=](int64_t s) { return cosine_warmup_decay(s, warmup, total); });
  if (name == "polynomial") {
    const double lr_init = opt.param_groups().at(0).get("lr");
    EMBER_CHECK(lr_init > lr_end, "get_scheduler: polynomial decay needs lr (", lr_init, ") above lr_end (", lr_end, ")");
    return std::make_unique<LRScheduler>(
        opt, [=](int64_t s) { return polynomial_warmup_decay(s, warmup, total, lr_init, lr_end, power); });
  }
  EMBER_FAIL("get_scheduler: unknown scheduler '", name,
             "' (expected constant, constant_with_warmup, linear, cosine or polynomial)");
}

}  // namespace ember::optim
