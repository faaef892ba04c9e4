#include "kernels/reference/reduce.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace ember::reference {
namespace {

std::vector<bool> reduced_mask(const Shape& dims, int64_t ndim) {
  if (ndim == 0) return {};  // a 0-d tensor has nothing to reduce
  std::vector<bool> mask(size_t(ndim), dims.empty());
  for (int64_t d : dims) mask[size_t(d < 0 ? d + ndim : d)] = true;
  return mask;
}

Shape output_shape(const Shape& shape, const std::vector<bool>& mask, bool keepdim) {
  Shape out;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (!mask[d]) out.push_back(shape[d]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}

// Flat index in the keepdim output of the input element at `idx`.
int64_t output_flat(const Shape& idx, const Shape& shape, const std::vector<bool>& mask) {
  int64_t f = 0;
  for (size_t d = 0; d < shape.size(); ++d)
    if (!mask[d]) f = f * shape[d] + idx[d];
  return f;
}

int64_t reduced_count(const Shape& shape, const std::vector<bool>& mask) {
  int64_t n = 1;
  for (size_t d = 0; d < shape.size(); ++d)
    if (mask[d]) n *= shape[d];
  return n;
}

// Folds every element into its output slot with fold(accumulated, value).
template <typename Fold>
RefTensor fold_reduce(const RefTensor& x, const Shape& dims, bool keepdim, double init, Fold fold) {
  const auto mask = reduced_mask(dims, x.dim());
  RefTensor out(output_shape(x.shape, mask, keepdim), init);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const int64_t o = output_flat(unravel(i, x.shape), x.shape, mask);
    out.data[size_t(o)] = fold(out.data[size_t(o)], x.data[size_t(i)]);
  }
  return out;
}

RefTensor arg_extreme(const RefTensor& x, int64_t dim, bool keepdim, bool is_max) {
  const int64_t nd = x.dim();
  const int64_t d = nd == 0 ? 0 : (dim < 0 ? dim + nd : dim);
  const auto mask = reduced_mask({d}, nd);
  RefTensor best_value(output_shape(x.shape, mask, keepdim), 0.0);
  RefTensor best_index(best_value.shape, -1.0);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const Shape idx = unravel(i, x.shape);
    const size_t o = size_t(output_flat(idx, x.shape, mask));
    const double v = x.data[size_t(i)];
    const double pos = nd == 0 ? 0.0 : double(idx[size_t(d)]);
    const double cur = best_value.data[o];
    bool take;
    if (best_index.data[o] < 0) take = true;
    else if (std::isnan(cur)) take = false;
    else if (std::isnan(v)) take = true;
    else take = is_max ? v > cur : v < cur;
    if (take) {
      best_value.data[o] = v;
      best_index.data[o] = pos;
    }
  }
  return best_index;
}

}  // namespace

RefTensor sum(const RefTensor& x, const Shape& dims, bool keepdim) {
  return fold_reduce(x, dims, keepdim, 0.0, [](double a, double v) { return a + v; });
}

RefTensor mean(const RefTensor& x, const Shape& dims, bool keepdim) {
  RefTensor s = sum(x, dims, keepdim);
  const double n = double(reduced_count(x.shape, reduced_mask(dims, x.dim())));
  for (double& v : s.data) v /= n;  // 0 / 0 = NaN for an empty reduction, as intended
  return s;
}

RefTensor amax(const RefTensor& x, const Shape& dims, bool keepdim) {
  return fold_reduce(x, dims, keepdim, -std::numeric_limits<double>::infinity(), [](double a, double v) {
    return std::isnan(a) || std::isnan(v) ? std::numeric_limits<double>::quiet_NaN() : std::max(a, v);
  });
}

RefTensor amin(const RefTensor& x, const Shape& dims, bool keepdim) {
  return fold_reduce(x, dims, keepdim, std::numeric_limits<double>::infinity(), [](double a, double v) {
    return std::isnan(a) || std::isnan(v) ? std::numeric_limits<double>::quiet_NaN() : std::min(a, v);
  });
}

RefTensor argmax(const RefTensor& x, int64_t dim, bool keepdim) { return arg_extreme(x, dim, keepdim, true); }
RefTensor argmin(const RefTensor& x, int64_t dim, bool keepdim) { return arg_extreme(x, dim, keepdim, false); }

RefTensor var(const RefTensor& x, const Shape& dims, int64_t correction, bool keepdim) {
  const auto mask = reduced_mask(dims, x.dim());
  const RefTensor m = mean(x, dims, true);
  RefTensor out(output_shape(x.shape, mask, keepdim), 0.0);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const int64_t o = output_flat(unravel(i, x.shape), x.shape, mask);
    const double dev = x.data[size_t(i)] - m.data[size_t(o)];
    out.data[size_t(o)] += dev * dev;
  }
  const int64_t n = reduced_count(x.shape, mask);
  const double dof = double(std::max<int64_t>(0, n - correction));
  for (double& v : out.data) v = n == 0 ? std::numeric_limits<double>::quiet_NaN() : v / dof;
  return out;
}

}  // namespace ember::reference
