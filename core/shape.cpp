#include "core/shape.h"

#include <algorithm>

namespace ember {

int64_t numel_of(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    st[i] = acc;
    acc *= shape[i] > 0 ? shape[i] : 1;
  }
  return st;
}

int64_t normalize_dim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t lo = ndim > 0 ? -ndim : -1, hi = ndim > 0 ? ndim - 1 : 0;
  EMBER_CHECK(dim >= lo && dim <= hi, op, ": dim ", dim, " out of range for a tensor with ", ndim,
              " dimension(s) (expected ", lo, " to ", hi, ")");
  return dim < 0 ? dim + (ndim > 0 ? ndim : 1) : dim;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    EMBER_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", a, " and ", b,
                " cannot be broadcast together (dim ", i, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Shape broadcast_strides(const Shape& shape, const Shape& strides, const Shape& target) {
  Shape out(target.size(), 0);
  const size_t off = target.size() - shape.size();
  for (size_t i = 0; i < shape.size(); ++i)
    out[off + i] = (shape[i] == 1 && target[off + i] != 1) ? 0 : strides[i];
  return out;
}

Shape infer_shape(Shape shape, int64_t numel, const char* op) {
  int64_t known = 1, infer_at = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      EMBER_CHECK(infer_at < 0, op, ": only one dimension can be -1, got ", shape);
      infer_at = int64_t(i);
    } else {
      EMBER_CHECK(shape[i] >= 0, op, ": invalid size ", shape[i], " in shape ", shape);
      known *= shape[i];
    }
  }
  if (infer_at >= 0) {
    EMBER_CHECK(known != 0 && numel % known == 0, op, ": shape ", shape,
                " is invalid for input of size ", numel);
    shape[infer_at] = numel / known;
  } else {
    EMBER_CHECK(known == numel, op, ": shape ", shape, " is invalid for input of size ", numel);
  }
  return shape;
}

}  // namespace ember
