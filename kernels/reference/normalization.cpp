#include "kernels/reference/normalization.h"

#include <algorithm>
#include <cmath>

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

}  // namespace ember::reference
