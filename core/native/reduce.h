// Reductions without autograd: sum, mean, amax, amin, argmax, argmin, var.
//
// Every reduction is brought to one geometry before it reaches a kernel: a contiguous
// source viewed as [outer, reduced, inner], reducing the middle dim. Reducing trailing
// dims gives inner == 1 (row reductions); reducing leading dims gives outer == 1 (column
// accumulation, e.g. a bias gradient [N, H] -> [H]). Any other pattern is permuted so the
// reduced dims come last and copied contiguous. The output is contiguous [outer, inner].
#pragma once
#include "core/dispatch.h"
#include "core/tensor.h"

namespace ember::native {

enum class ReduceKind : uint8_t { sum, mean, amax, amin };

// A contiguous source and the [outer, reduced, inner] split of it.
struct ReduceGeometry {
  Tensor src;
  int64_t outer = 1, reduced = 1, inner = 1;
};

// out[o, i] = reduce over r of src[o, r, i]; out is contiguous with outer * inner elements.
EMBER_DECLARE_STUB(reduce_stub, void (*)(const Tensor& out, const ReduceGeometry& g, ReduceKind kind));
// out (i64) = index along r of the max (is_max) or min; NaN counts as the extreme; first on ties.
EMBER_DECLARE_STUB(arg_reduce_stub, void (*)(const Tensor& out, const ReduceGeometry& g, bool is_max));
// out = sum over r of (src - mean)^2 / max(0, reduced - correction).
EMBER_DECLARE_STUB(var_stub, void (*)(const Tensor& out, const ReduceGeometry& g, int64_t correction));

// Sorted, de-duplicated, non-negative dims; empty input means every dim. `op` names the caller.
Shape reduction_dims(const Shape& dims, const Shape& shape, const char* op);
// The result shape: reduced dims dropped, or kept as size 1 when keepdim.
Shape reduced_shape(const Shape& shape, const Shape& dims, bool keepdim);
// The [outer, reduced, inner] view of `x` reducing `dims` (already normalised).
ReduceGeometry reduce_geometry(const Tensor& x, const Shape& dims);

Tensor sum(const Tensor& x, const Shape& dims, bool keepdim);
Tensor mean(const Tensor& x, const Shape& dims, bool keepdim);
Tensor amax(const Tensor& x, const Shape& dims, bool keepdim);
Tensor amin(const Tensor& x, const Shape& dims, bool keepdim);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim);
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim);
Tensor var(const Tensor& x, const Shape& dims, int64_t correction, bool keepdim);

}  // namespace ember::native
