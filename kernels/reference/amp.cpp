#include "kernels/reference/amp.h"

#include <cmath>

#include "core/error.h"

namespace ember::reference {

namespace {
// The smallest magnitude that rounds to infinity in a binary format with `precision`
// significand bits and largest exponent `max_exponent`: the largest finite value plus half
// an ulp, (2 - 2^-precision) * 2^max_exponent (a tie rounds to even, which is infinity).
double overflow_threshold(DType dtype) {
  switch (dtype) {
    case DType::f16: return (2.0 - std::ldexp(1.0, -11)) * std::ldexp(1.0, 15);
    case DType::bf16: return (2.0 - std::ldexp(1.0, -8)) * std::ldexp(1.0, 127);
    case DType::f32: return (2.0 - std::ldexp(1.0, -24)) * std::ldexp(1.0, 127);
    case DType::f64: return INFINITY;  // computed in double already: overflow shows as inf
    default: EMBER_FAIL("reference amp_unscale: expected a floating-point dtype, got ", dtype_name(dtype));
  }
}
}  // namespace

UnscaleResult amp_unscale(const RefTensor& grad, double inv_scale, DType dtype) {
  const double limit = overflow_threshold(dtype);
  UnscaleResult out{RefTensor(grad.shape), false};
  for (int64_t i = 0; i < grad.numel(); ++i) {
    const double v = grad.data[size_t(i)] * inv_scale;
    out.grad.data[size_t(i)] = v;
    if (!std::isfinite(v) || std::abs(v) >= limit) out.found_inf = true;
  }
  return out;
}

}  // namespace ember::reference
