// Softmax, log-softmax and layer normalisation without autograd, plus their backward
// passes (dedicated kernels: these sit on the transformer hot path).
//
// Softmax geometry: a contiguous tensor viewed as [outer, len, inner], normalising along len.
// inner == 1 is the common case (last dim) and runs row by row.
#pragma once
#include "core/dispatch.h"
#include "core/tensor.h"

namespace ember::native {

struct SoftmaxGeometry {
  int64_t outer = 1, len = 1, inner = 1;
};

// out = softmax (or log_softmax when `log`) of x along len; both contiguous, same dtype.
EMBER_DECLARE_STUB(softmax_stub, void (*)(const Tensor& out, const Tensor& x, const SoftmaxGeometry& g, bool log));
// grad_in from grad_out and the forward output y (all contiguous, same dtype):
//   softmax:      grad_in = y * (grad_out - sum(grad_out * y))
//   log_softmax:  grad_in = grad_out - exp(y) * sum(grad_out)
EMBER_DECLARE_STUB(softmax_backward_stub, void (*)(const Tensor& grad_in, const Tensor& grad_out, const Tensor& y,
                                                   const SoftmaxGeometry& g, bool log));

// Layer norm over rows of `cols` elements of contiguous x [rows, cols]: writes y (x's dtype)
// and per-row mean and rstd = 1/sqrt(var + eps) (f64 for f64 input, f32 otherwise). weight and
// bias are undefined or contiguous [cols] in the statistics' dtype.
EMBER_DECLARE_STUB(layer_norm_stub, void (*)(const Tensor& y, const Tensor& mean, const Tensor& rstd,
                                             const Tensor& x, const Tensor& weight, const Tensor& bias,
                                             int64_t rows, int64_t cols, double eps));
// From grad [rows, cols] (x's dtype, contiguous): dx (x's dtype), dweight and dbias ([cols],
// statistics' dtype). Any output may be undefined to skip it; weight undefined means ones.
//   dx = rstd * (g*w - mean(g*w) - xhat * mean(g*w*xhat)),  dweight = sum_rows g*xhat,  dbias = sum_rows g
EMBER_DECLARE_STUB(layer_norm_backward_stub,
                   void (*)(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& grad,
                            const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                            int64_t rows, int64_t cols));

Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
// `y` is the forward output; the result has y's shape and dtype.
Tensor softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim);
Tensor log_softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim);

struct LayerNormResult {
  Tensor y;
  Tensor mean, rstd;  // [rows], saved for backward
};
LayerNormResult layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                           const Tensor& bias, double eps);

struct LayerNormGrads {
  Tensor dx, dweight, dbias;  // dweight / dbias in the dtype of weight / bias
};
// Needs: which gradients to compute. weight / bias as passed to layer_norm (may be undefined).
LayerNormGrads layer_norm_backward(const Tensor& grad, const Tensor& x, const Shape& normalized_shape,
                                   const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                                   const Tensor& bias, bool need_dx, bool need_dweight, bool need_dbias);

}  // namespace ember::native
