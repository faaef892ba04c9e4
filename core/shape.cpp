#include "core/shape.h"

#include <algorithm>

namespace ember {

int64_t numel_of(const Shape& shape, const char* op) {
  bool has_zero = false;
  for (int64_t s : shape) {
    EMBER_CHECK(s >= 0, op, ": negative size ", s, " in shape ", shape);
    has_zero |= s == 0;
  }
  if (has_zero) return 0;  // even when the other sizes alone would overflow
  int64_t n = 1;
  for (int64_t s : shape)
    EMBER_CHECK(!__builtin_mul_overflow(n, s, &n), op, ": shape ", shape, " has more than 2^63 - 1 elements");
  return n;
}

size_t nbytes_of(const Shape& shape, size_t itemsize, const char* op) {
  int64_t bytes = 0;
  EMBER_CHECK(!__builtin_mul_overflow(numel_of(shape, op), int64_t(itemsize), &bytes), op, ": shape ",
              shape, " of ", itemsize, "-byte elements needs more than 2^63 - 1 bytes");
  return size_t(bytes);
}

Shape contiguous_strides(const Shape& shape, const char* op) {
  Shape st(shape.size());
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    st[i] = acc;
    if (i == 0) break;  // the product of all sizes is no stride
    EMBER_CHECK(shape[i] >= 0, op, ": negative size ", shape[i], " in shape ", shape);
    EMBER_CHECK(!__builtin_mul_overflow(acc, std::max<int64_t>(shape[i], 1), &acc), op, ": shape ", shape,
                " has a stride past 2^63 - 1");
  }
  return st;
}

int64_t storage_extent(const Shape& shape, const Shape& strides, int64_t offset, const char* op) {
  EMBER_CHECK(shape.size() == strides.size(), op, ": shape ", shape, " and strides ", strides,
              " differ in length");
  if (numel_of(shape, op) == 0) return 0;
  int64_t lo = offset, hi = offset;
  bool overflow = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    int64_t reach = 0;
    overflow |= __builtin_mul_overflow(shape[i] - 1, strides[i], &reach);
    overflow |= __builtin_add_overflow(reach < 0 ? lo : hi, reach, reach < 0 ? &lo : &hi);
  }
  int64_t extent = 0;
  overflow |= __builtin_add_overflow(hi, int64_t(1), &extent);
  EMBER_CHECK(!overflow, op, ": a view of shape ", shape, " with strides ", strides, " at offset ", offset,
              " reaches past element 2^63 - 1");
  EMBER_CHECK(lo >= 0, op, ": a view of shape ", shape, " with strides ", strides, " at offset ", offset,
              " reaches element ", lo, ", before the start of its storage");
  return extent;
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
  int64_t count = 1;
  for (int64_t s : out) {
    EMBER_CHECK(s >= 0, op, ": negative size ", s, " in broadcast of shapes ", a, " and ", b);
    EMBER_CHECK(!__builtin_mul_overflow(count, s, &count), op, ": shapes ", a, " and ", b, " broadcast to ",
                out, ", which has more than 2^63 - 1 elements");
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
  int64_t infer_at = -1;
  bool has_zero = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      EMBER_CHECK(infer_at < 0, op, ": only one dimension can be -1, got ", shape);
      infer_at = int64_t(i);
    } else {
      EMBER_CHECK(shape[i] >= 0, op, ": invalid size ", shape[i], " in shape ", shape);
      has_zero |= shape[i] == 0;
    }
  }
  int64_t known = has_zero ? 0 : 1;
  for (size_t i = 0; i < shape.size() && !has_zero; ++i)
    if (int64_t(i) != infer_at)
      EMBER_CHECK(!__builtin_mul_overflow(known, shape[i], &known), op, ": shape ", shape,
                  " has more than 2^63 - 1 elements");
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
