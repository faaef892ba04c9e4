// Helpers shared by the batch, group and RMS norm tests: random [N, C, *] shapes and the
// conditioning that sets the absolute tolerance of a normalised result.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/reference/ref_tensor.h"
#include "test_util.h"

namespace ember::testing::norm {

// [N, C, *] with min_ndim to max_ndim dims (at least 2), each in [1, max_size].
inline Shape random_channel_shape(int min_ndim, int max_ndim, int64_t max_size) {
  Shape shape = random_shape(int(uniform_int(std::max(2, min_ndim), max_ndim)), max_size);
  for (int64_t& d : shape) d = std::max<int64_t>(d, 1);
  return shape;
}

// Worst max|x| / (var + eps)^(power / 2) over the normalisation sets of x [N, C, *]: set_of(n, c)
// numbers the set that channel c of sample n belongs to. The kernels' x - mean loses about an
// ulp of max|x|, and normalising divides that by the set's deviation (power 1, the forward); the
// gradient's terms carry one more factor rstd (power 2).
template <typename SetOf>
double set_conditioning(const reference::RefTensor& x, double eps, const SetOf& set_of, int power = 1) {
  const int64_t n = x.shape[0], c = x.shape[1], s = n * c == 0 ? 0 : x.numel() / (n * c);
  int64_t sets = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < c; ++j) sets = std::max(sets, set_of(i, j) + 1);
  const size_t n_sets = static_cast<size_t>(sets);
  std::vector<double> sum(n_sets, 0.0), sq(n_sets, 0.0), peak(n_sets, 0.0), count(n_sets, 0.0);
  for (int pass = 0; pass < 2; ++pass)
    for (int64_t i = 0; i < x.numel(); ++i) {
      const size_t k = size_t(set_of(i / (c * s), (i / s) % c));
      const double v = x.data[size_t(i)];
      if (pass == 0) sum[k] += v, count[k] += 1, peak[k] = std::max(peak[k], std::abs(v));
      else sq[k] += (v - sum[k] / count[k]) * (v - sum[k] / count[k]);
    }
  double worst = 1.0;
  for (size_t k = 0; k < size_t(sets); ++k)
    if (count[k] > 0) worst = std::max(worst, peak[k] / std::pow(sq[k] / count[k] + eps, 0.5 * power));
  return worst;
}

inline double channel_conditioning(const reference::RefTensor& x, double eps, int power = 1) {
  return set_conditioning(x, eps, [](int64_t, int64_t c) { return c; }, power);
}

inline double group_conditioning(const reference::RefTensor& x, int64_t groups, double eps, int power = 1) {
  const int64_t cg = x.shape[1] / groups;
  return set_conditioning(x, eps, [&](int64_t n, int64_t c) { return n * groups + c / cg; }, power);
}

// Backward results subtract nearly equal terms, so input rounding shows in absolute terms.
inline double grad_tolerance(DType dt) {
  return dt == DType::f64 ? 1e-9 : dt == DType::f32 ? 2e-5 : 4 * tolerance(dt);
}

}  // namespace ember::testing::norm
