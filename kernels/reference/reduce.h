// Reference reductions: every input element is visited once and folded into the output
// element it maps to. Dims may be negative; an empty dims list means every dim.
#pragma once
#include "kernels/reference/ref_tensor.h"

namespace ember::reference {

RefTensor sum(const RefTensor& x, const Shape& dims, bool keepdim);
RefTensor mean(const RefTensor& x, const Shape& dims, bool keepdim);
// NaN wins: a reduction that meets a NaN returns NaN.
RefTensor amax(const RefTensor& x, const Shape& dims, bool keepdim);
RefTensor amin(const RefTensor& x, const Shape& dims, bool keepdim);
// Index (as a double) of the first maximum/minimum; the first NaN counts as the extreme.
RefTensor argmax(const RefTensor& x, int64_t dim, bool keepdim);
RefTensor argmin(const RefTensor& x, int64_t dim, bool keepdim);
// Sum of squared deviations from the mean divided by max(0, N - correction).
RefTensor var(const RefTensor& x, const Shape& dims, int64_t correction, bool keepdim);

}  // namespace ember::reference
