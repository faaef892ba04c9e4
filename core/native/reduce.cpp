#include "core/native/reduce.h"

#include <algorithm>

#include "core/native/copy.h"
#include "core/native/views.h"

namespace ember::native {

EMBER_DEFINE_STUB(reduce_stub);
EMBER_DEFINE_STUB(arg_reduce_stub);
EMBER_DEFINE_STUB(var_stub);

namespace {

int64_t checked_dim(int64_t d, const Shape& shape, const char* op) {
  const int64_t nd = int64_t(shape.size());
  // A 0-d tensor accepts dim 0 and -1, as in PyTorch.
  const int64_t lo = nd > 0 ? -nd : -1, hi = nd > 0 ? nd - 1 : 0;
  EMBER_CHECK(d >= lo && d <= hi, op, ": dim ", d, " out of range for a tensor of shape ", shape,
              " (expected ", lo, " to ", hi, ")");
  return d < 0 ? d + std::max<int64_t>(nd, 1) : d;
}

}  // namespace

Shape reduction_dims(const Shape& dims, const Shape& shape, const char* op) {
  const int64_t nd = int64_t(shape.size());
  Shape out;
  if (dims.empty()) {
    for (int64_t d = 0; d < nd; ++d) out.push_back(d);
    return out;
  }
  for (int64_t d : dims) {
    const int64_t n = checked_dim(d, shape, op);
    EMBER_CHECK(std::find(out.begin(), out.end(), n) == out.end(), op, ": dim ", n,
                " appears more than once in ", dims, " (tensor of shape ", shape, ")");
    out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  // Reducing a 0-d tensor over "dim 0" reduces nothing.
  if (nd == 0) out.clear();
  return out;
}

Shape reduced_shape(const Shape& shape, const Shape& dims, bool keepdim) {
  Shape out;
  for (int64_t d = 0; d < int64_t(shape.size()); ++d) {
    const bool reduced = std::find(dims.begin(), dims.end(), d) != dims.end();
    if (!reduced) out.push_back(shape[d]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}

ReduceGeometry reduce_geometry(const Tensor& x, const Shape& dims) {
  const Shape& shape = x.shape();
  const int64_t nd = x.dim();
  auto is_reduced = [&](int64_t d) { return std::find(dims.begin(), dims.end(), d) != dims.end(); };
  ReduceGeometry g;
  if (x.is_contiguous()) {
    // Size-1 dims do not affect the layout; the rest must be kept* reduced* kept*.
    int state = 0;  // 0: before the reduced run, 1: inside it, 2: after it
    bool fits = true;
    for (int64_t d = 0; d < nd && fits; ++d) {
      if (shape[d] == 1) continue;
      const bool r = is_reduced(d);
      if (r && state == 0) state = 1;
      else if (r && state == 2) fits = false;
      else if (!r && state == 1) state = 2;
      if (r) g.reduced *= shape[d];
      else if (state == 0) g.outer *= shape[d];
      else g.inner *= shape[d];
    }
    if (fits) {
      g.src = x;
      return g;
    }
  }
  Shape perm;
  g = ReduceGeometry{};
  for (int64_t d = 0; d < nd; ++d)
    if (!is_reduced(d)) {
      perm.push_back(d);
      g.outer *= shape[d];
    }
  for (int64_t d : dims) {
    perm.push_back(d);
    g.reduced *= shape[d];
  }
  g.src = contiguous(permute(x, perm));
  return g;
}

Tensor sum(const Tensor& x, const Shape& dims, bool keepdim) {
  const Shape d = reduction_dims(dims, x.shape(), "sum");
  const DType dt = is_floating(x.dtype()) ? x.dtype() : DType::i64;  // ints and bools sum to i64
  Tensor out = make_tensor(reduced_shape(x.shape(), d, keepdim), dt, x.device());
  if (out.numel() == 0) return out;
  reduce_stub.call(x.device(), "sum")(out, reduce_geometry(x, d), ReduceKind::sum);
  return out;
}

Tensor mean(const Tensor& x, const Shape& dims, bool keepdim) {
  EMBER_CHECK(is_floating(x.dtype()), "mean: expected a floating-point tensor, got ",
              dtype_name(x.dtype()), " of shape ", x.shape(), " (convert it with .to(ember::kFloat32))");
  const Shape d = reduction_dims(dims, x.shape(), "mean");
  Tensor out = make_tensor(reduced_shape(x.shape(), d, keepdim), x.dtype(), x.device());
  if (out.numel() == 0) return out;
  reduce_stub.call(x.device(), "mean")(out, reduce_geometry(x, d), ReduceKind::mean);
  return out;
}

namespace {

Tensor min_or_max(const Tensor& x, const Shape& dims, bool keepdim, ReduceKind kind, const char* op) {
  const Shape d = reduction_dims(dims, x.shape(), op);
  for (int64_t k : d)
    EMBER_CHECK(x.shape()[k] != 0, op, ": cannot reduce over dim ", k, " of size 0 (tensor of shape ",
                x.shape(), "): the result has no identity");
  Tensor out = make_tensor(reduced_shape(x.shape(), d, keepdim), x.dtype(), x.device());
  if (out.numel() == 0) return out;
  reduce_stub.call(x.device(), op)(out, reduce_geometry(x, d), kind);
  return out;
}

Tensor arg_min_or_max(const Tensor& x, int64_t dim, bool keepdim, bool is_max, const char* op) {
  const Shape d = reduction_dims({dim}, x.shape(), op);
  for (int64_t k : d)
    EMBER_CHECK(x.shape()[k] != 0, op, ": cannot reduce over dim ", k, " of size 0 (tensor of shape ",
                x.shape(), ")");
  Tensor out = make_tensor(reduced_shape(x.shape(), d, keepdim), DType::i64, x.device());
  if (out.numel() == 0) return out;
  arg_reduce_stub.call(x.device(), op)(out, reduce_geometry(x, d), is_max);
  return out;
}

}  // namespace

Tensor amax(const Tensor& x, const Shape& dims, bool keepdim) {
  return min_or_max(x, dims, keepdim, ReduceKind::amax, "amax");
}

Tensor amin(const Tensor& x, const Shape& dims, bool keepdim) {
  return min_or_max(x, dims, keepdim, ReduceKind::amin, "amin");
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  return arg_min_or_max(x, dim, keepdim, true, "argmax");
}

Tensor argmin(const Tensor& x, int64_t dim, bool keepdim) {
  return arg_min_or_max(x, dim, keepdim, false, "argmin");
}

Tensor var(const Tensor& x, const Shape& dims, int64_t correction, bool keepdim) {
  EMBER_CHECK(is_floating(x.dtype()), "var: expected a floating-point tensor, got ",
              dtype_name(x.dtype()), " of shape ", x.shape());
  EMBER_CHECK(correction >= 0, "var: correction must be non-negative, got ", correction);
  const Shape d = reduction_dims(dims, x.shape(), "var");
  Tensor out = make_tensor(reduced_shape(x.shape(), d, keepdim), x.dtype(), x.device());
  if (out.numel() == 0) return out;
  var_stub.call(x.device(), "var")(out, reduce_geometry(x, d), correction);
  return out;
}

}  // namespace ember::native
