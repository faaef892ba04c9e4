#include "optim/grad_scaler.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "core/factory.h"
#include "core/grad_mode.h"
#include "core/native/amp.h"
#include "core/ops.h"
#include "core/sparse_grad.h"

namespace ember::optim {

namespace {

// The scale is kept as an f32 value, as PyTorch keeps it (checkpoints then agree).
double as_f32(double v) { return double(float(v)); }

void check_scale(const char* where, double scale) {
  EMBER_CHECK(std::isfinite(scale) && scale > 0 && std::isfinite(float(scale)) && float(scale) > 0, where,
              ": the scale must be positive and finite in float32, got ", scale);
}

void check_factors(const char* where, double growth_factor, double backoff_factor, int64_t growth_interval) {
  EMBER_CHECK(std::isfinite(growth_factor) && growth_factor > 1.0, where, ": growth_factor must be > 1, got ",
              growth_factor);
  EMBER_CHECK(backoff_factor > 0.0 && backoff_factor < 1.0, where, ": backoff_factor must be in (0, 1), got ",
              backoff_factor);
  EMBER_CHECK(growth_interval >= 1, where, ": growth_interval must be >= 1, got ", growth_interval);
}

}  // namespace

GradScaler::GradScaler(GradScalerOptions options, OverflowAgreement agree)
    : scale_(options.init_scale), growth_factor_(options.growth_factor), backoff_factor_(options.backoff_factor),
      growth_interval_(options.growth_interval), enabled_(options.enabled), agree_(std::move(agree)) {
  check_scale("GradScaler: init_scale", options.init_scale);
  check_factors("GradScaler", growth_factor_, backoff_factor_, growth_interval_);
  scale_ = as_f32(scale_);
}

Tensor GradScaler::scale(const Tensor& loss) const {
  EMBER_CHECK(loss.defined(), "GradScaler::scale: the loss is undefined");
  if (!enabled_) return loss;
  EMBER_CHECK(loss.is_floating_point(), "GradScaler::scale: expected a floating-point loss, got ",
              dtype_name(loss.dtype()));
  return loss * scale_;
}

bool GradScaler::unscale_grads(Optimizer& opt) {
  NoGradGuard no_grad;
  const double inv_scale = 1.0 / scale_;
  // One flag per device the gradients live on: the kernels only ever write their own device.
  std::vector<std::pair<Device, Tensor>> flags;
  auto flag_for = [&](Device d) -> Tensor {
    for (const auto& [device, flag] : flags)
      if (device == d) return flag;
    flags.emplace_back(d, zeros({1}, {DType::f32, d}));
    return flags.back().second;
  };
  for (auto& group : opt.param_groups())
    for (const auto& p : group.params) {
      // A gradient that is rows alone is unscaled as rows (the zeros it stands for stay zero).
      const Tensor grad = p.has_sparse_grad() && !p.dense_grad_part().defined() ? p.sparse_grad().values : p.grad();
      if (grad.defined()) native::amp_unscale_(grad, flag_for(grad.device()), inv_scale);
    }
  double found = 0.0;
  for (const auto& [device, flag] : flags) found = std::max(found, flag.item<double>());
  if (agree_) {
    const auto& groups = opt.param_groups();
    const Device grads_device = !groups.empty() && !groups.front().params.empty()
                                    ? groups.front().params.front().device() : Device::cpu();
    return agree_(found != 0.0, grads_device);
  }
  return found != 0.0;
}

void GradScaler::unscale_(Optimizer& opt) {
  if (!enabled_) return;
  auto it = states_.find(&opt);
  if (it != states_.end()) {
    EMBER_CHECK(it->second.stage != Stage::Stepped, "GradScaler::unscale_: unscale_() is being called after step() "
                "for this optimizer (", opt.name(), "); call update() first");
    EMBER_FAIL("GradScaler::unscale_: unscale_() has already been called on this optimizer (", opt.name(),
               ") since the last update()");
  }
  const bool found_inf = unscale_grads(opt);
  states_[&opt] = OptimizerState{Stage::Unscaled, found_inf};
}

bool GradScaler::step(Optimizer& opt) {
  if (!enabled_) {
    opt.step();
    return true;
  }
  auto it = states_.find(&opt);
  if (it == states_.end()) {
    unscale_(opt);
    it = states_.find(&opt);
  } else {
    EMBER_CHECK(it->second.stage != Stage::Stepped, "GradScaler::step: step() has already been called on this "
                "optimizer (", opt.name(), ") since the last update()");
  }
  const bool skip = it->second.found_inf;
  if (!skip) opt.step();
  it->second.stage = Stage::Stepped;
  return !skip;
}

void GradScaler::update(std::optional<double> new_scale) {
  if (!enabled_) return;
  if (new_scale) {
    check_scale("GradScaler::update: new_scale", *new_scale);
    scale_ = as_f32(*new_scale);
  } else {
    EMBER_CHECK(!states_.empty(), "GradScaler::update: no optimizer was unscaled or stepped since the last "
                "update(); call step(optimizer) first");
    bool found_inf = false;
    for (const auto& [opt, state] : states_) found_inf = found_inf || state.found_inf;
    if (found_inf) {
      scale_ = as_f32(scale_ * backoff_factor_);
      growth_tracker_ = 0;
    } else if (++growth_tracker_ >= growth_interval_) {
      // Growth that would overflow float32 is dropped; the count restarts either way.
      const float grown = float(scale_ * growth_factor_);
      if (std::isfinite(grown)) scale_ = double(grown);
      growth_tracker_ = 0;
    }
  }
  states_.clear();
}

bool GradScaler::is_unscaled(const Optimizer& opt) const { return states_.count(&opt) != 0; }

bool GradScaler::awaiting_step() const {
  for (const auto& [opt, state] : states_)
    if (state.stage == Stage::Unscaled) return true;
  return false;
}

std::map<std::string, double> GradScaler::state_dict() const {
  if (!enabled_) return {};
  return {{"scale", scale_},
          {"growth_factor", growth_factor_},
          {"backoff_factor", backoff_factor_},
          {"growth_interval", double(growth_interval_)},
          {"growth_tracker", double(growth_tracker_)}};
}

void GradScaler::load_state_dict(const std::map<std::string, double>& state) {
  if (!enabled_) return;
  EMBER_CHECK(!state.empty(), "GradScaler::load_state_dict: the state is empty, possibly because it was saved "
              "from a disabled GradScaler");
  auto get = [&](const char* key) {
    auto it = state.find(key);
    EMBER_CHECK(it != state.end(), "GradScaler::load_state_dict: the state has no '", key, "'");
    return it->second;
  };
  const double scale = get("scale"), growth = get("growth_factor"), backoff = get("backoff_factor");
  const double interval = get("growth_interval"), tracker = get("growth_tracker");
  check_scale("GradScaler::load_state_dict: scale", scale);
  EMBER_CHECK(interval == std::floor(interval) && tracker == std::floor(tracker) && tracker >= 0 && interval < 9e18,
              "GradScaler::load_state_dict: growth_interval (", interval, ") and growth_tracker (", tracker,
              ") must be whole non-negative numbers");
  check_factors("GradScaler::load_state_dict", growth, backoff, int64_t(interval));
  scale_ = as_f32(scale);
  growth_factor_ = growth;
  backoff_factor_ = backoff;
  growth_interval_ = int64_t(interval);
  growth_tracker_ = int64_t(tracker);
}

}  // namespace ember::optim
