#include "linalg_check.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "test_util.h"

namespace ember::testing {

reference::RefTensor ref_abs(reference::RefTensor r) {
  for (auto& v : r.data) v = std::abs(v);
  return r;
}

double product_rel(DType dtype, int64_t k, bool tf32) {
  const DType acc = dtype == DType::f64 ? DType::f64 : DType::f32;
  double rel = tolerance(dtype) + tolerance(acc) * std::sqrt(double(std::max<int64_t>(k, 1)));
  if (tf32 && dtype == DType::f32) rel += 2.0 * std::ldexp(1.0, -11);
  return rel;
}

namespace {

// The spacing of `dtype`'s subnormals: rounding a tiny result into it can move it by half of
// this whatever its relative error, so it floors every bound.
double subnormal_step(DType dtype) {
  switch (dtype) {
    case DType::f16: return std::ldexp(1.0, -24);
    case DType::bf16: return std::ldexp(1.0, -133);
    case DType::f32: return std::ldexp(1.0, -149);
    default: return 0.0;
  }
}

}  // namespace

::testing::AssertionResult product_close(const Tensor& got, const reference::RefTensor& want,
                                         const reference::RefTensor& scale, DType dtype, int64_t k, bool tf32) {
  if (got.shape() != want.shape)
    return ::testing::AssertionFailure() << "shape " << shape_str(got.shape()) << " != " << shape_str(want.shape);
  if (got.dtype() != dtype) return ::testing::AssertionFailure() << "dtype " << got.dtype() << " != " << dtype;
  const double rel = product_rel(dtype, k, tf32), floor = subnormal_step(dtype);
  const std::vector<double> g = got.to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i) {
    const double bound = rel * scale.data[i] + floor;
    if (!(std::abs(g[i] - want.data[i]) <= bound))
      return ::testing::AssertionFailure() << "at flat index " << i << " of " << shape_str(got.shape()) << ": got "
                                           << g[i] << ", expected " << want.data[i] << " (bound " << bound << ")";
  }
  return ::testing::AssertionSuccess();
}

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::Contiguous: return "contiguous";
    case Layout::Transposed: return "transposed";
    case Layout::Padded: return "padded rows";
    case Layout::TransposedPadded: return "transposed, padded";
    case Layout::Misaligned: return "misaligned by one element";
    case Layout::Strided: return "strided (needs a copy)";
    case Layout::BatchPermuted: return "batch dim permuted";
    case Layout::BatchExpanded: return "batch dims expanded";
  }
  return "?";
}

Tensor layout_operand(const Shape& shape, DType dtype, Layout layout, Device device) {
  const int64_t nd = int64_t(shape.size());
  switch (layout) {
    case Layout::Contiguous: break;
    case Layout::Transposed:
      if (nd >= 2) {
        Shape s = shape;
        std::swap(s[nd - 1], s[nd - 2]);
        return random_tensor(s, dtype).to(device).transpose(-1, -2);
      }
      break;
    case Layout::Padded: {
      Shape s = shape;
      s.back() += 3;
      return random_tensor(s, dtype).to(device).narrow(-1, 1, shape.back());
    }
    case Layout::TransposedPadded:
      if (nd >= 2) {
        Shape s = shape;
        std::swap(s[nd - 1], s[nd - 2]);
        s.back() += 2;
        return random_tensor(s, dtype).to(device).narrow(-1, 2, shape[nd - 2]).transpose(-1, -2);
      }
      break;
    case Layout::Misaligned: {
      const int64_t count = numel_of(shape);
      return random_tensor({count + 1}, dtype).to(device).narrow(0, 1, count).view(shape);
    }
    case Layout::Strided: {
      if (nd < 2) break;
      Shape big = shape;
      for (auto& s : big) s = s * 2 + 1;
      std::swap(big[nd - 1], big[nd - 2]);
      Tensor v = random_tensor(big, dtype).to(device).transpose(-1, -2);
      for (int64_t d = 0; d < nd; ++d) v = v.slice(d, 1, 1 + 2 * shape[size_t(d)], 2);
      return v;
    }
    case Layout::BatchPermuted:
      if (nd >= 3) {
        Shape s = shape;
        std::swap(s[0], s[nd - 2]);
        return random_tensor(s, dtype).to(device).transpose(0, nd - 2);
      }
      break;
    case Layout::BatchExpanded:
      if (nd >= 3) {
        Shape s = shape;
        for (int64_t d = 0; d < nd - 2; ++d) s[d] = 1;
        return random_tensor(s, dtype).to(device).expand(shape);
      }
      break;
  }
  return random_tensor(shape, dtype).to(device);
}

std::pair<Shape, Shape> matmul_shapes(int ra, int rb, int64_t max_mat, bool allow_zero) {
  const int64_t lo = allow_zero ? 0 : 1;
  const int64_t n = uniform_int(lo, max_mat), k = uniform_int(lo, max_mat), m = uniform_int(lo, max_mat);
  const int nb = std::max({ra - 2, rb - 2, 0});
  Shape batch(static_cast<size_t>(nb), 1);
  for (auto& s : batch) s = uniform_int(lo, 3);
  auto batch_part = [&](int rank) {
    Shape s(batch.end() - std::max(rank - 2, 0), batch.end());
    for (auto& d : s)
      if (uniform_int(0, 2) == 0) d = 1;  // broadcast against the other operand
    return s;
  };
  Shape a = ra == 1 ? Shape{k} : batch_part(ra), b = rb == 1 ? Shape{k} : batch_part(rb);
  if (ra >= 2) a.insert(a.end(), {n, k});
  if (rb >= 2) b.insert(b.end(), {k, m});
  return {a, b};
}

}  // namespace ember::testing
