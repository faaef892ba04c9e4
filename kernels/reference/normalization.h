// Reference softmax, log-softmax and layer normalisation, with their backward formulas,
// written directly from the definitions in double precision.
#pragma once
#include "kernels/reference/ref_tensor.h"

namespace ember::reference {

RefTensor softmax(const RefTensor& x, int64_t dim);
RefTensor log_softmax(const RefTensor& x, int64_t dim);
// Gradients with respect to x, given the forward output y and the output gradient g.
RefTensor softmax_backward(const RefTensor& g, const RefTensor& y, int64_t dim);
RefTensor log_softmax_backward(const RefTensor& g, const RefTensor& y, int64_t dim);

// Normalises over the trailing `normalized_ndim` dims (biased variance), then scales by
// weight and shifts by bias when given (pointers may be null).
RefTensor layer_norm(const RefTensor& x, int64_t normalized_ndim, const RefTensor* weight,
                     const RefTensor* bias, double eps);

struct LayerNormGrads {
  RefTensor dx, dweight, dbias;
};
LayerNormGrads layer_norm_backward(const RefTensor& g, const RefTensor& x, int64_t normalized_ndim,
                                   const RefTensor* weight, double eps);

}  // namespace ember::reference
