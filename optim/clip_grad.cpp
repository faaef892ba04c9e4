#include "optim/clip_grad.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/grad_mode.h"
#include "core/native/fused_optim.h"
#include "core/ops.h"
#include "core/sparse_grad.h"

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

namespace {
// A gradient that is rows alone (core/sparse_grad.h) on the CPU, for the 2- or inf-norm: its
// norm comes from the rows, and clipping scales the rows.
bool norm_from_rows(const Tensor& p, double norm_type) {
  return (norm_type == 2.0 || std::isinf(norm_type)) && p.has_sparse_grad() && !p.dense_grad_part().defined() &&
         p.device().is_cpu() && p.sparse_grad().indices.dtype() == DType::i64;
}

// accumulate_grad_norm's term for the zero-filled gradient the rows stand for, bit for bit.
double rows_norm_term(const RowSparseGrad& rows, double norm_type) {
  NoGradGuard ng;
  // As accumulate_grad_norm: f64 stays f64, anything else is widened to f32.
  const Tensor values = (rows.values.dtype() == DType::f64 ? rows.values : rows.values.to(DType::f32)).contiguous();
  if (std::isinf(norm_type)) return rows.nnz_rows() == 0 ? 0.0 : amax(abs(values)).item<double>();
  return native::rows_sum_of_squares(rows.indices.contiguous(), values, rows.rows);
}
}  // namespace

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  // Terms are combined in parameter order, as accumulate_grad_norm over all the gradients does.
  std::vector<Tensor> scaled;  // dense gradients, and the values of row-sparse ones
  scaled.reserve(params.size());
  double accumulated = 0.0;
  for (const auto& p : params) {
    double term;
    if (norm_from_rows(p, norm_type)) {
      const RowSparseGrad rows = p.sparse_grad();
      term = rows_norm_term(rows, norm_type);
      scaled.push_back(rows.values);
    } else {
      scaled.push_back(p.grad());
      term = accumulate_grad_norm({scaled.back()}, norm_type);
    }
    accumulated = std::isinf(norm_type) ? std::max(accumulated, term) : accumulated + term;
  }
  const double total = finish_grad_norm(accumulated, norm_type);
  scale_grads_to_norm(scaled, max_norm, total, error_if_nonfinite);
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
