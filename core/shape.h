// Shapes, strides and NumPy broadcasting. Every count here is checked: a shape whose element
// count, byte count or strides do not fit in int64_t raises ember::Error naming the op and the
// shape, so no tensor is ever made from a wrapped-around size.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/error.h"

namespace ember {

using Shape = std::vector<int64_t>;

// The element count; throws naming `op` and the shape for a negative size or a count past
// 2^63 - 1.
int64_t numel_of(const Shape& shape, const char* op = "numel");
// The byte count of a contiguous tensor of `shape` with `itemsize`-byte elements, after the
// checks of numel_of; throws when the bytes do not fit in int64_t.
size_t nbytes_of(const Shape& shape, size_t itemsize, const char* op);
// Row-major strides; throws naming `op` when one does not fit in int64_t (a shape with a zero
// size can have a count of 0 and still huge strides).
Shape contiguous_strides(const Shape& shape, const char* op = "contiguous_strides");
// The storage elements a view of `shape` and `strides` starting at `offset` reaches: one past
// the largest element index, 0 for a view with no elements. Throws naming `op` when the view
// would read before element 0 or when the extent overflows.
int64_t storage_extent(const Shape& shape, const Shape& strides, int64_t offset, const char* op);
// Wraps a possibly negative dim into [0, ndim); `op` names the caller in the error.
int64_t normalize_dim(int64_t dim, int64_t ndim, const char* op);
// NumPy broadcasting of two shapes; throws naming `op` when they are incompatible or their
// broadcast has too many elements.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
// Strides of `shape` viewed as `target` (which it broadcasts to): size-1 and missing dims get stride 0.
Shape broadcast_strides(const Shape& shape, const Shape& strides, const Shape& target);
// Resolves one -1 entry against numel; throws on anything else invalid.
Shape infer_shape(Shape shape, int64_t numel, const char* op);

}  // namespace ember
