// Loss scaling for f16 mixed precision, as torch.cuda.amp.GradScaler. Half-precision
// gradients of a small loss underflow to zero; multiplying the loss by a large factor keeps
// them representable, and the gradients are divided by the same factor before the update.
// When the factor is too large the gradients overflow: the update is skipped and the factor
// shrinks; after growth_interval clean steps in a row it grows again.
//
//   optim::GradScaler scaler;
//   for (...) {
//     { AutocastGuard ac(device.type, DType::f16); loss = compute_loss(); }
//     scaler.scale(loss).backward();
//     scaler.unscale_(opt);                      // optional: to clip the true gradients
//     optim::clip_grad_norm_(params, 1.0);
//     scaler.step(opt);                          // skipped when a gradient is inf/NaN
//     scaler.update();
//     opt.zero_grad();
//   }
//
// Unscaling and the inf/NaN check are one pass over each gradient (native::amp_unscale_).
// Gradients of any floating dtype are unscaled in place (PyTorch refuses f16 gradients here;
// keep parameters in f32 and they never are). In data-parallel training the verdict "some
// gradient was not finite" must be the same on every rank, so that an overflow on one rank
// skips the update on every rank and the replicas stay identical: whoever runs the ranks
// passes an OverflowAgreement (distributed::agree_on_overflow all-reduces the flag), and the
// scaler uses what it returns instead of its own verdict.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "core/device.h"
#include "optim/optimizer.h"

namespace ember::optim {

// Turns this process's verdict (some gradient of the optimizer was inf/NaN) into the job's.
// `grads_device` is where the optimizer's gradients live, for a collective that wants the
// flag on that device. Every rank calls it in the same order.
using OverflowAgreement = std::function<bool(bool found_inf_here, Device grads_device)>;

struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;   // > 1
  double backoff_factor = 0.5;  // in (0, 1)
  int64_t growth_interval = 2000;
  // Disabled: scale() returns the loss, step() always steps, update() does nothing.
  bool enabled = true;
};

class GradScaler {
 public:
  // `agree`, when given, is called with every unscale's verdict; with a collective behind it,
  // every rank calls unscale_/step in the same order.
  explicit GradScaler(GradScalerOptions options = {}, OverflowAgreement agree = {});

  // loss * get_scale() (the loss itself when disabled).
  Tensor scale(const Tensor& loss) const;
  // Divides the gradients of `opt`'s parameters by the scale, in place, and records whether
  // any is inf/NaN. At most once per optimizer between update()s, and not after step().
  void unscale_(Optimizer& opt);
  // Unscales (unless unscale_ did already) and runs opt.step() unless a gradient was not
  // finite. Returns whether the optimizer stepped. At most once per optimizer per update().
  bool step(Optimizer& opt);
  // Adjusts the scale after the step(s) of this iteration: times backoff_factor when any
  // optimizer saw inf/NaN (and the growth count restarts), times growth_factor after
  // growth_interval clean iterations in a row. With new_scale, sets the scale to it instead.
  void update(std::optional<double> new_scale = std::nullopt);

  double get_scale() const { return enabled_ ? scale_ : 1.0; }
  bool is_enabled() const { return enabled_; }
  double get_growth_factor() const { return growth_factor_; }
  double get_backoff_factor() const { return backoff_factor_; }
  int64_t get_growth_interval() const { return growth_interval_; }
  // Clean iterations since the scale last changed (PyTorch's _growth_tracker).
  int64_t growth_tracker() const { return growth_tracker_; }
  // True when opt's gradients were unscaled since the last update() (by unscale_ or step).
  bool is_unscaled(const Optimizer& opt) const;
  // True when some optimizer was unscaled by unscale_() and has not stepped yet.
  bool awaiting_step() const;

  // {"scale", "growth_factor", "backoff_factor", "growth_interval", "growth_tracker"}; empty
  // when disabled (as PyTorch's). The same map restores the scaler; loading into a disabled
  // scaler does nothing, loading an empty map into an enabled one is an ember::Error.
  std::map<std::string, double> state_dict() const;
  void load_state_dict(const std::map<std::string, double>& state);

 private:
  enum class Stage { Unscaled, Stepped };
  struct OptimizerState {
    Stage stage = Stage::Unscaled;
    bool found_inf = false;
  };
  bool unscale_grads(Optimizer& opt);

  double scale_;
  double growth_factor_;
  double backoff_factor_;
  int64_t growth_interval_;
  bool enabled_;
  int64_t growth_tracker_ = 0;
  OverflowAgreement agree_;
  std::map<const Optimizer*, OptimizerState> states_;  // this iteration's, cleared by update()
};

}  // namespace ember::optim
