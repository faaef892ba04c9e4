#include "optim/clip_grad.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/grad_mode.h"
#include "core/ops.h"

namespace ember::optim {

double accumulate_grad_norm(const std::vector<Tensor>& grads, double norm_type) {
  NoGradGuard ng;
  const bool inf_norm = std::isinf(norm_type);
  EMBER_CHECK(inf_norm || norm_type > 0, "clip_grad_norm_: norm_type must be positive, got ", norm_type);
  double total = 0.0;
  for (const auto& g : grads) {
    if (!g.defined() || g.numel() == 0) continue;
    // Norms in the gradient's own precision (f64 stays f64); half types are widened to f32.
    Tensor a = abs(g.dtype() == DType::f64 ? g : g.to(DType::f32));
    if (inf_norm) {
      total = std::max(total, amax(a).item<double>());
    } else if (norm_type == 2.0) {
      total += sum(a * a).item<double>();
    } else {
      total += sum(pow(a, norm_type)).item<double>();
    }
  }
  return total;
}

double finish_grad_norm(double accumulated, double norm_type) {
  return std::isinf(norm_type) ? accumulated : std::pow(accumulated, 1.0 / norm_type);
}

void scale_grads_to_norm(const std::vector<Tensor>& grads, double max_norm, double total_norm,
                         bool error_if_nonfinite) {
  NoGradGuard ng;
  if (!std::isfinite(total_norm)) {
    EMBER_CHECK(!error_if_nonfinite, "clip_grad_norm_: the total norm of the gradients is ", total_norm,
                "; set error_if_nonfinite=false to skip this check");
    return;
  }
  const double coef = max_norm / (total_norm + 1e-6);
  if (coef >= 1.0) return;
  for (const auto& g : grads)
    if (g.defined()) Tensor(g).mul_(coef);
}

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  std::vector<Tensor> grads;
  grads.reserve(params.size());
  for (const auto& p : params) grads.push_back(p.grad());
  const double total = finish_grad_norm(accumulate_grad_norm(grads, norm_type), norm_type);
  scale_grads_to_norm(grads, max_norm, total, error_if_nonfinite);
  return total;
}

void clip_grad_value_(const std::vector<Tensor>& params, double clip_value) {
  NoGradGuard ng;
  EMBER_CHECK(clip_value >= 0, "clip_grad_value_: clip_value must be non-negative, got ", clip_value);
  for (const auto& p : params) {
    Tensor g = p.grad();
    if (g.defined()) g.copy_(clamp(g, -clip_value, clip_value));
  }
}

}  // namespace ember::optim
