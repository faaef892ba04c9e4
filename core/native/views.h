// Geometry of views: new shape/strides/offset over the same storage. No autograd here;
// autograd/functions/views.cpp wraps these with their backward.
#pragma once
#include <optional>

#include "core/tensor.h"

namespace ember::native {

// Strides for viewing `x` as `shape` without a copy, or empty when impossible.
std::optional<Shape> view_strides(const Tensor& x, const Shape& shape);
Tensor view(const Tensor& x, const Shape& shape);     // throws when a copy would be needed
Tensor reshape(const Tensor& x, const Shape& shape);  // view when possible, else a copy
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
Tensor permute(const Tensor& x, const Shape& dims);
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step);
Tensor select(const Tensor& x, int64_t dim, int64_t index);
Tensor expand(const Tensor& x, const Shape& shape);
Tensor squeeze(const Tensor& x, std::optional<int64_t> dim);
Tensor unsqueeze(const Tensor& x, int64_t dim);

}  // namespace ember::native
