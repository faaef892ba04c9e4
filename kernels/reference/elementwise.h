// Reference elementwise ops: one plain loop per op over broadcast double values.
#pragma once
#include <functional>
#include <string>

#include "kernels/reference/ref_tensor.h"

namespace ember::reference {

// out[i] = f(x[i]).
RefTensor elementwise_map(const RefTensor& x, const std::function<double(double)>& f);
// out = f(a, b) over the broadcast shape of a and b.
RefTensor elementwise_zip(const RefTensor& a, const RefTensor& b, const std::function<double(double, double)>& f);

RefTensor add(const RefTensor& a, const RefTensor& b, double alpha = 1.0);
RefTensor sub(const RefTensor& a, const RefTensor& b, double alpha = 1.0);
RefTensor mul(const RefTensor& a, const RefTensor& b);
RefTensor div(const RefTensor& a, const RefTensor& b);
RefTensor pow(const RefTensor& a, const RefTensor& b);
RefTensor pow(const RefTensor& a, double exponent);
RefTensor maximum(const RefTensor& a, const RefTensor& b);  // NaN wins
RefTensor minimum(const RefTensor& a, const RefTensor& b);  // NaN wins

RefTensor neg(const RefTensor& x);
RefTensor exp(const RefTensor& x);
RefTensor log(const RefTensor& x);
RefTensor sqrt(const RefTensor& x);
RefTensor rsqrt(const RefTensor& x);
RefTensor tanh(const RefTensor& x);
RefTensor sigmoid(const RefTensor& x);
RefTensor relu(const RefTensor& x);
RefTensor leaky_relu(const RefTensor& x, double negative_slope);
RefTensor gelu(const RefTensor& x, bool tanh_approx);
RefTensor silu(const RefTensor& x);
RefTensor abs(const RefTensor& x);
RefTensor clamp(const RefTensor& x, double min, double max);  // pass +-inf for an absent bound

// Comparisons give 1.0 (true) or 0.0 (false).
RefTensor eq(const RefTensor& a, const RefTensor& b);
RefTensor ne(const RefTensor& a, const RefTensor& b);
RefTensor lt(const RefTensor& a, const RefTensor& b);
RefTensor le(const RefTensor& a, const RefTensor& b);
RefTensor gt(const RefTensor& a, const RefTensor& b);
RefTensor ge(const RefTensor& a, const RefTensor& b);
// cond and mask: nonzero means true.
RefTensor where(const RefTensor& cond, const RefTensor& a, const RefTensor& b);
RefTensor masked_fill(const RefTensor& x, const RefTensor& mask, double value);

// Derivative f'(x) of a unary op at every element. `op` is one of neg exp log sqrt rsqrt tanh
// sigmoid relu leaky_relu gelu gelu_tanh silu abs pow clamp; `p0`, `p1` are pow's exponent or
// clamp's bounds, `p0` leaky_relu's slope.
RefTensor unary_derivative(const std::string& op, const RefTensor& x, double p0 = 0.0, double p1 = 0.0);

}  // namespace ember::reference
