// Shapes, strides and NumPy broadcasting.
#pragma once
#include <cstdint>
#include <vector>

#include "core/error.h"

namespace ember {

using Shape = std::vector<int64_t>;

int64_t numel_of(const Shape& shape);
Shape contiguous_strides(const Shape& shape);
// Wraps a possibly negative dim into [0, ndim); `op` names the caller in the error.
int64_t normalize_dim(int64_t dim, int64_t ndim, const char* op);
// NumPy broadcasting of two shapes; throws naming `op` when they are incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
// Strides of `shape` viewed as `target` (which it broadcasts to): size-1 and missing dims get stride 0.
Shape broadcast_strides(const Shape& shape, const Shape& strides, const Shape& target);
// Resolves one -1 entry against numel; throws on anything else invalid.
Shape infer_shape(Shape shape, int64_t numel, const char* op);

}  // namespace ember
