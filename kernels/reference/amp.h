// Reference loss unscaling: each gradient value divided by the scale, and whether any result
// is not a finite value of the gradient's dtype.
#pragma once
#include "kernels/reference/ref_tensor.h"

namespace ember::reference {

struct UnscaleResult {
  RefTensor grad;          // grad * inv_scale, in double
  bool found_inf = false;  // some input is inf/NaN, or some result overflows `dtype`
};

// `dtype` is the gradient's dtype: a result at or beyond the point where rounding to it gives
// infinity counts as an overflow.
UnscaleResult amp_unscale(const RefTensor& grad, double inv_scale, DType dtype);

}  // namespace ember::reference
