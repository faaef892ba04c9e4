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

// Batch norm of x [N, C, *]. In training the batch statistics (biased variance) normalise and
// the returned running statistics are the given ones moved towards the batch mean and the
// unbiased variance; otherwise the running statistics normalise. Pointers may be null.
struct BatchNormResult {
  RefTensor y, running_mean, running_var;
};
BatchNormResult batch_norm(const RefTensor& x, const RefTensor* running_mean, const RefTensor* running_var,
                           const RefTensor* weight, const RefTensor* bias, bool training, double momentum,
                           double eps);
// dx, dweight, dbias ([C]) of batch_norm; running statistics are read when not training.
LayerNormGrads batch_norm_backward(const RefTensor& g, const RefTensor& x, const RefTensor* running_mean,
                                   const RefTensor* running_var, const RefTensor* weight, bool training, double eps);

// Group norm of x [N, C, *] over groups of C / num_groups channels; weight and bias [C] or null.
RefTensor group_norm(const RefTensor& x, int64_t num_groups, const RefTensor* weight, const RefTensor* bias,
                     double eps);
LayerNormGrads group_norm_backward(const RefTensor& g, const RefTensor& x, int64_t num_groups,
                                   const RefTensor* weight, double eps);

// x / sqrt(mean(x^2) + eps) * weight over the trailing `normalized_ndim` dims (weight may be null).
RefTensor rms_norm(const RefTensor& x, int64_t normalized_ndim, const RefTensor* weight, double eps);
struct RmsNormGrads {
  RefTensor dx, dweight;
};
RmsNormGrads rms_norm_backward(const RefTensor& g, const RefTensor& x, int64_t normalized_ndim,
                               const RefTensor* weight, double eps);

}  // namespace ember::reference
