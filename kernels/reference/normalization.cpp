#include "kernels/reference/normalization.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

namespace ember::reference {
namespace {

// Calls fn(positions) for every line along `dim`: the flat positions of its elements.
template <typename Fn>
void for_each_line(const Shape& shape, int64_t dim, Fn fn) {
  const int64_t nd = int64_t(shape.size());
  const int64_t d = nd == 0 ? 0 : (dim < 0 ? dim + nd : dim);
  const int64_t len = nd == 0 ? 1 : shape[size_t(d)];
  int64_t stride = 1;
  for (int64_t k = d + 1; k < nd; ++k) stride *= shape[size_t(k)];
  const int64_t total = numel_of(shape);
  if (len == 0) return;
  std::vector<int64_t> pos(static_cast<size_t>(len));
  for (int64_t start = 0; start < total; ++start) {
    // a line starts at every element whose index along `dim` is 0
    if ((start / stride) % len != 0) continue;
    for (int64_t i = 0; i < len; ++i) pos[size_t(i)] = start + i * stride;
    fn(pos);
  }
}

// The largest value m on a line and sum(exp(x - m)) over it: the stable softmax denominator.
struct LineExpSum {
  double max;
  double sum;
};

LineExpSum line_exp_sum(const RefTensor& x, const std::vector<int64_t>& pos) {
  double m = -INFINITY;
  for (int64_t p : pos) m = std::max(m, x.data[size_t(p)]);
  double s = 0;
  for (int64_t p : pos) s += std::exp(x.data[size_t(p)] - m);
  return {m, s};
}

}  // namespace

RefTensor softmax(const RefTensor& x, int64_t dim) {
  RefTensor out(x.shape);
  for_each_line(x.shape, dim, [&](const std::vector<int64_t>& pos) {
    const auto [m, s] = line_exp_sum(x, pos);
    for (int64_t p : pos) out.data[size_t(p)] = std::exp(x.data[size_t(p)] - m) / s;
  });
  return out;
}

RefTensor log_softmax(const RefTensor& x, int64_t dim) {
  RefTensor out(x.shape);
  for_each_line(x.shape, dim, [&](const std::vector<int64_t>& pos) {
    const auto [m, s] = line_exp_sum(x, pos);
    const double lse = m + std::log(s);
    for (int64_t p : pos) out.data[size_t(p)] = x.data[size_t(p)] - lse;
  });
  return out;
}

RefTensor softmax_backward(const RefTensor& g, const RefTensor& y, int64_t dim) {
  RefTensor dx(y.shape);
  for_each_line(y.shape, dim, [&](const std::vector<int64_t>& pos) {
    double dot = 0;
    for (int64_t p : pos) dot += g.data[size_t(p)] * y.data[size_t(p)];
    for (int64_t p : pos) dx.data[size_t(p)] = y.data[size_t(p)] * (g.data[size_t(p)] - dot);
  });
  return dx;
}

RefTensor log_softmax_backward(const RefTensor& g, const RefTensor& y, int64_t dim) {
  RefTensor dx(y.shape);
  for_each_line(y.shape, dim, [&](const std::vector<int64_t>& pos) {
    double gs = 0;
    for (int64_t p : pos) gs += g.data[size_t(p)];
    for (int64_t p : pos) dx.data[size_t(p)] = g.data[size_t(p)] - std::exp(y.data[size_t(p)]) * gs;
  });
  return dx;
}

namespace {
int64_t normalized_size(const RefTensor& x, int64_t normalized_ndim) {
  int64_t n = 1;
  for (int64_t k = x.dim() - normalized_ndim; k < x.dim(); ++k) n *= x.shape[size_t(k)];
  return n;
}

// Mean and 1 / sqrt(biased variance + eps) of the n values at xr.
struct RowMoments {
  double mean;
  double rstd;
};

RowMoments row_moments(const double* xr, int64_t n, double eps) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m += xr[i];
  m /= double(n);
  double v = 0;
  for (int64_t i = 0; i < n; ++i) v += (xr[i] - m) * (xr[i] - m);
  v /= double(n);
  return {m, 1.0 / std::sqrt(v + eps)};
}
}  // namespace

RefTensor layer_norm(const RefTensor& x, int64_t normalized_ndim, const RefTensor* weight,
                     const RefTensor* bias, double eps) {
  const int64_t n = normalized_size(x, normalized_ndim);
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  RefTensor out(x.shape);
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = x.data.data() + r * n;
    const auto [m, rstd] = row_moments(xr, n, eps);
    for (int64_t i = 0; i < n; ++i) {
      double y = (xr[i] - m) * rstd;
      if (weight) y *= weight->data[size_t(i)];
      if (bias) y += bias->data[size_t(i)];
      out.data[size_t(r * n + i)] = y;
    }
  }
  return out;
}

LayerNormGrads layer_norm_backward(const RefTensor& g, const RefTensor& x, int64_t normalized_ndim,
                                   const RefTensor* weight, double eps) {
  const int64_t n = normalized_size(x, normalized_ndim);
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  const Shape wshape(x.shape.end() - normalized_ndim, x.shape.end());
  LayerNormGrads out{RefTensor(x.shape), RefTensor(wshape), RefTensor(wshape)};
  std::vector<double> xhat(static_cast<size_t>(n)), gw(static_cast<size_t>(n));
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = x.data.data() + r * n;
    const double* gr = g.data.data() + r * n;
    const auto [m, rstd] = row_moments(xr, n, eps);
    double mean_gw = 0, mean_gw_xhat = 0;
    for (int64_t i = 0; i < n; ++i) {
      xhat[size_t(i)] = (xr[i] - m) * rstd;
      gw[size_t(i)] = gr[i] * (weight ? weight->data[size_t(i)] : 1.0);
      mean_gw += gw[size_t(i)];
      mean_gw_xhat += gw[size_t(i)] * xhat[size_t(i)];
      out.dweight.data[size_t(i)] += gr[i] * xhat[size_t(i)];
      out.dbias.data[size_t(i)] += gr[i];
    }
    mean_gw /= double(n);
    mean_gw_xhat /= double(n);
    for (int64_t i = 0; i < n; ++i)
      out.dx.data[size_t(r * n + i)] = rstd * (gw[size_t(i)] - mean_gw - xhat[size_t(i)] * mean_gw_xhat);
  }
  return out;
}

// ---- batch norm and group norm: normalisation over sets of elements, an affine map per channel

namespace {

// x [N, C, *]: the channel of flat index i is (i / spatial) % C.
struct ChannelLayout {
  int64_t n, c, s;
  explicit ChannelLayout(const RefTensor& x) : n(x.shape[0]), c(x.shape[1]), s(1) {
    for (size_t d = 2; d < x.shape.size(); ++d) s *= x.shape[d];
  }
  int64_t channel(int64_t i) const { return (i / s) % c; }
};

// Mean and biased variance of each set, sets given by set_of(flat index).
template <typename SetOf>
std::pair<std::vector<double>, std::vector<double>> set_moments(const RefTensor& x, int64_t sets,
                                                                const SetOf& set_of) {
  std::vector<double> mean(size_t(sets), 0.0), var(size_t(sets), 0.0), count(size_t(sets), 0.0);
  for (int64_t i = 0; i < x.numel(); ++i) {
    mean[size_t(set_of(i))] += x.data[size_t(i)];
    count[size_t(set_of(i))] += 1;
  }
  for (int64_t k = 0; k < sets; ++k) mean[size_t(k)] /= count[size_t(k)];
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double d = x.data[size_t(i)] - mean[size_t(set_of(i))];
    var[size_t(set_of(i))] += d * d;
  }
  for (int64_t k = 0; k < sets; ++k) var[size_t(k)] /= count[size_t(k)];
  return {mean, var};
}

// y = (x - mean[set]) / sqrt(var[set] + eps) * weight[channel] + bias[channel].
template <typename SetOf>
RefTensor normalize_sets(const RefTensor& x, const std::vector<double>& mean, const std::vector<double>& var,
                         const SetOf& set_of, const RefTensor* weight, const RefTensor* bias, double eps) {
  const ChannelLayout lay(x);
  RefTensor y(x.shape);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const size_t k = size_t(set_of(i)), c = size_t(lay.channel(i));
    double v = (x.data[size_t(i)] - mean[k]) / std::sqrt(var[k] + eps);
    if (weight) v *= weight->data[c];
    if (bias) v += bias->data[c];
    y.data[size_t(i)] = v;
  }
  return y;
}

// Gradients of normalize_sets. batch_stats: mean and var are the sets' own moments (so they
// depend on x); otherwise they are constants.
template <typename SetOf>
LayerNormGrads normalize_sets_backward(const RefTensor& g, const RefTensor& x, const std::vector<double>& mean,
                                       const std::vector<double>& var, int64_t sets, const SetOf& set_of,
                                       const RefTensor* weight, double eps, bool batch_stats) {
  const ChannelLayout lay(x);
  LayerNormGrads out{RefTensor(x.shape), RefTensor({lay.c}), RefTensor({lay.c})};
  std::vector<double> mean_gw(size_t(sets), 0.0), mean_gw_xhat(size_t(sets), 0.0), count(size_t(sets), 0.0);
  auto xhat = [&](int64_t i) {
    const size_t k = size_t(set_of(i));
    return (x.data[size_t(i)] - mean[k]) / std::sqrt(var[k] + eps);
  };
  auto gw = [&](int64_t i) { return g.data[size_t(i)] * (weight ? weight->data[size_t(lay.channel(i))] : 1.0); };
  for (int64_t i = 0; i < x.numel(); ++i) {
    const size_t k = size_t(set_of(i)), c = size_t(lay.channel(i));
    mean_gw[k] += gw(i);
    mean_gw_xhat[k] += gw(i) * xhat(i);
    count[k] += 1;
    out.dweight.data[c] += g.data[size_t(i)] * xhat(i);
    out.dbias.data[c] += g.data[size_t(i)];
  }
  for (int64_t i = 0; i < x.numel(); ++i) {
    const size_t k = size_t(set_of(i));
    const double rstd = 1.0 / std::sqrt(var[k] + eps);
    out.dx.data[size_t(i)] = batch_stats
                                 ? rstd * (gw(i) - mean_gw[k] / count[k] - xhat(i) * mean_gw_xhat[k] / count[k])
                                 : rstd * gw(i);
  }
  return out;
}

}  // namespace

BatchNormResult batch_norm(const RefTensor& x, const RefTensor* running_mean, const RefTensor* running_var,
                           const RefTensor* weight, const RefTensor* bias, bool training, double momentum,
                           double eps) {
  const ChannelLayout lay(x);
  const auto set_of = [&](int64_t i) { return lay.channel(i); };
  BatchNormResult r;
  if (running_mean) r.running_mean = *running_mean;
  if (running_var) r.running_var = *running_var;
  if (!training) {
    r.y = normalize_sets(x, running_mean->data, running_var->data, set_of, weight, bias, eps);
    return r;
  }
  const auto [mean, var] = set_moments(x, lay.c, set_of);
  r.y = normalize_sets(x, mean, var, set_of, weight, bias, eps);
  const double n = double(lay.n * lay.s);
  for (int64_t c = 0; c < lay.c && running_mean; ++c) {
    double& rm = r.running_mean.data[size_t(c)];
    double& rv = r.running_var.data[size_t(c)];
    rm = (1 - momentum) * rm + momentum * mean[size_t(c)];
    rv = (1 - momentum) * rv + momentum * var[size_t(c)] * n / (n - 1);
  }
  return r;
}

LayerNormGrads batch_norm_backward(const RefTensor& g, const RefTensor& x, const RefTensor* running_mean,
                                   const RefTensor* running_var, const RefTensor* weight, bool training, double eps) {
  const ChannelLayout lay(x);
  const auto set_of = [&](int64_t i) { return lay.channel(i); };
  if (!training)
    return normalize_sets_backward(g, x, running_mean->data, running_var->data, lay.c, set_of, weight, eps, false);
  const auto [mean, var] = set_moments(x, lay.c, set_of);
  return normalize_sets_backward(g, x, mean, var, lay.c, set_of, weight, eps, true);
}

RefTensor group_norm(const RefTensor& x, int64_t num_groups, const RefTensor* weight, const RefTensor* bias,
                     double eps) {
  const ChannelLayout lay(x);
  const int64_t cg = lay.c / num_groups;
  const auto set_of = [&](int64_t i) { return (i / (lay.s * lay.c)) * num_groups + lay.channel(i) / cg; };
  const auto [mean, var] = set_moments(x, lay.n * num_groups, set_of);
  return normalize_sets(x, mean, var, set_of, weight, bias, eps);
}

LayerNormGrads group_norm_backward(const RefTensor& g, const RefTensor& x, int64_t num_groups,
                                   const RefTensor* weight, double eps) {
  const ChannelLayout lay(x);
  const int64_t cg = lay.c / num_groups;
  const auto set_of = [&](int64_t i) { return (i / (lay.s * lay.c)) * num_groups + lay.channel(i) / cg; };
  const auto [mean, var] = set_moments(x, lay.n * num_groups, set_of);
  return normalize_sets_backward(g, x, mean, var, lay.n * num_groups, set_of, weight, eps, true);
}

// ---- RMS norm

namespace {
double row_rms_rstd(const double* xr, int64_t n, double eps) {
  double ms = 0;
  for (int64_t i = 0; i < n; ++i) ms += xr[i] * xr[i];
  return 1.0 / std::sqrt(ms / double(n) + eps);
}
}  // namespace

RefTensor rms_norm(const RefTensor& x, int64_t normalized_ndim, const RefTensor* weight, double eps) {
  const int64_t n = normalized_size(x, normalized_ndim);
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  RefTensor out(x.shape);
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = x.data.data() + r * n;
    const double rstd = row_rms_rstd(xr, n, eps);
    for (int64_t i = 0; i < n; ++i)
      out.data[size_t(r * n + i)] = xr[i] * rstd * (weight ? weight->data[size_t(i)] : 1.0);
  }
  return out;
}

RmsNormGrads rms_norm_backward(const RefTensor& g, const RefTensor& x, int64_t normalized_ndim,
                               const RefTensor* weight, double eps) {
  const int64_t n = normalized_size(x, normalized_ndim);
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  const Shape wshape(x.shape.end() - normalized_ndim, x.shape.end());
  RmsNormGrads out{RefTensor(x.shape), RefTensor(wshape)};
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = x.data.data() + r * n;
    const double* gr = g.data.data() + r * n;
    const double rstd = row_rms_rstd(xr, n, eps);
    // y_i = x_i rstd w_i; d rstd / d x_j = -rstd^3 x_j / n
    double dot = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double w = weight ? weight->data[size_t(i)] : 1.0;
      dot += gr[i] * w * xr[i];
      out.dweight.data[size_t(i)] += gr[i] * xr[i] * rstd;
    }
    for (int64_t j = 0; j < n; ++j) {
      const double w = weight ? weight->data[size_t(j)] : 1.0;
      out.dx.data[size_t(r * n + j)] = gr[j] * w * rstd - dot * rstd * rstd * rstd * xr[j] / double(n);
    }
  }
  return out;
}

}  // namespace ember::reference
