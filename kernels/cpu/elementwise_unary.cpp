// CPU kernels of the one-operand elementwise ops and their fused backward
// (grad_in = grad_out * f'(x)). Half types compute in float.
//
// float exp, tanh, sigmoid and gelu use the branch-free approximations below rather than libm
// calls, so that GCC turns each loop into AVX2 code. That needs FP compares and conversions to be
// treated as non-trapping (we never read the FP exception flags) and sqrt not to set errno.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math", "no-math-errno")
#endif
#include <bit>
#include <cmath>
#include <limits>
#include <type_traits>

#include "core/native/elementwise.h"
#include "core/strided_loop.h"
#include "core/type_dispatch.h"

namespace ember {
namespace {

using native::UnaryOp;
using native::UnaryParams;

template <typename A> constexpr A kSqrtHalf = A(0.70710678118654752440);       // 1/sqrt(2)
template <typename A> constexpr A kInvSqrt2Pi = A(0.39894228040143267794);     // 1/sqrt(2*pi)
template <typename A> constexpr A kSqrt2OverPi = A(0.79788456080286535588);    // sqrt(2/pi)
template <typename A> constexpr A kGeluCubic = A(0.044715);

// ---- float approximations (relative error about 1e-7, measured against double libm)

// 2^n for an integer n in [-126, 127], straight from the exponent bits.
inline float pow2i(int32_t n) { return std::bit_cast<float>(uint32_t(n + 127) << 23); }

// e^x = 2^n e^r with n = round(x / ln2), |r| <= ln2 / 2, e^r by a degree-7 polynomial
// (Cephes' expf coefficients). Saturates to 0 and inf; NaN passes through.
inline float fast_exp(float x) {
  const float lo = x < -104.0f ? -104.0f : x;
  const float xc = lo > 89.0f ? 89.0f : lo;
  const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round via 1.5 * 2^23
  const float r = (xc - n * 0.693359375f) + n * 2.12194440e-4f;               // ln2 split in two
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const int32_t ni = n == n ? int32_t(n) : 0;
  const int32_t h = ni >> 1;
  return y * pow2i(h) * pow2i(ni - h);  // two factors keep each power of two a normal float
}

// Odd polynomial near 0 (where 1 - 2/(e^2x + 1) would cancel), the exp form elsewhere.
inline float fast_tanh(float x) {
  const float ax = std::fabs(x), z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float near0 = x + x * z * p;
  const float far = 1.0f - 2.0f / (fast_exp(2.0f * ax) + 1.0f);
  return ax < 0.625f ? near0 : std::copysign(far, x);
}

// Standard normal CDF from erfc(|x|/sqrt2) ~ t P(t) e^(-x^2/2), t = 1/(1 + p|x|/sqrt2)
// (Abramowitz & Stegun 7.1.26, absolute error below 1.5e-7).
inline float fast_normal_cdf(float x) {
  const float z = std::fabs(x) * 0.70710678118654752f;
  const float t = 1.0f / (1.0f + 0.3275911f * z);
  float p = 1.061405429f;
  p = p * t - 1.453152027f;
  p = p * t + 1.421413741f;
  p = p * t - 0.284496736f;
  p = p * t + 0.254829592f;
  const float q = p * t * fast_exp(-z * z);
  return x >= 0.0f ? 1.0f - 0.5f * q : 0.5f * q;
}

template <typename A> A exp_of(A x) {
  if constexpr (std::is_same_v<A, float>) return fast_exp(x);
  else return std::exp(x);
}
template <typename A> A tanh_of(A x) {
  if constexpr (std::is_same_v<A, float>) return fast_tanh(x);
  else return std::tanh(x);
}
template <typename A> A normal_cdf(A x) {
  if constexpr (std::is_same_v<A, float>) return fast_normal_cdf(x);
  else return A(0.5) * std::erfc(-x * kSqrtHalf<A>);
}

template <typename A> A sigmoid_of(A x) { return A(1) / (A(1) + exp_of(-x)); }

// tanh-form gelu: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
template <typename A> A gelu_tanh_of(A x) {
  return A(0.5) * x * (A(1) + tanh_of(kSqrt2OverPi<A> * (x + kGeluCubic<A> * x * x * x)));
}
template <typename A> A gelu_tanh_grad(A x) {
  const A x2 = x * x;
  const A t = tanh_of(kSqrt2OverPi<A> * x * (A(1) + kGeluCubic<A> * x2));
  const A dinner = kSqrt2OverPi<A> * (A(1) + A(3) * kGeluCubic<A> * x2);
  return A(0.5) * (A(1) + t) + A(0.5) * x * (A(1) - t * t) * dinner;
}

// erf-form gelu: x Phi(x), Phi the standard normal CDF; derivative Phi(x) + x phi(x).
template <typename A> A gelu_of(A x) { return x * normal_cdf(x); }
template <typename A> A gelu_grad(A x) { return normal_cdf(x) + x * kInvSqrt2Pi<A> * exp_of(A(-0.5) * x * x); }

// Integer bounds of clamp: the double bounds rounded inwards and saturated to T's range.
template <typename T> T int_lower_bound(double lo) {
  if (!(lo > double(std::numeric_limits<T>::lowest()))) return std::numeric_limits<T>::lowest();
  if (lo >= double(std::numeric_limits<T>::max())) return std::numeric_limits<T>::max();
  return T(std::ceil(lo));
}
template <typename T> T int_upper_bound(double hi) {
  if (!(hi < double(std::numeric_limits<T>::max()))) return std::numeric_limits<T>::max();
  if (hi <= double(std::numeric_limits<T>::lowest())) return std::numeric_limits<T>::lowest();
  return T(std::floor(hi));
}

template <typename T, typename F>
void map(const Tensor& out, const Tensor& x, const F& f) {
  StridedLoop loop(out.shape(), {out, x});
  unary_loop<T, T>(loop, f);
}

template <typename T>
void floating_unary(UnaryOp op, const Tensor& out, const Tensor& x, UnaryParams p) {
  using A = acc_t<T>;
  switch (op) {
    case UnaryOp::Neg: return map<T>(out, x, [](A v) { return -v; });
    case UnaryOp::Exp: return map<T>(out, x, [](A v) { return exp_of(v); });
    case UnaryOp::Log: return map<T>(out, x, [](A v) { return std::log(v); });
    case UnaryOp::Sqrt: return map<T>(out, x, [](A v) { return std::sqrt(v); });
    case UnaryOp::Rsqrt: return map<T>(out, x, [](A v) { return A(1) / std::sqrt(v); });
    case UnaryOp::Tanh: return map<T>(out, x, [](A v) { return tanh_of(v); });
    case UnaryOp::Sigmoid: return map<T>(out, x, [](A v) { return sigmoid_of(v); });
    case UnaryOp::Relu: return map<T>(out, x, [](A v) { return v < A(0) ? A(0) : v; });  // NaN stays NaN
    case UnaryOp::Gelu: return map<T>(out, x, [](A v) { return gelu_of(v); });
    case UnaryOp::GeluTanh: return map<T>(out, x, [](A v) { return gelu_tanh_of(v); });
    case UnaryOp::Abs: return map<T>(out, x, [](A v) { return std::abs(v); });
    case UnaryOp::PowScalar: {
      const A e = A(p.a);
      if (p.a == 2.0) return map<T>(out, x, [](A v) { return v * v; });
      if (p.a == 1.0) return map<T>(out, x, [](A v) { return v; });
      return map<T>(out, x, [e](A v) { return std::pow(v, e); });
    }
    case UnaryOp::Clamp: {
      const A lo = A(p.a), hi = A(p.b);
      // min(max(x, lo), hi): NaN input stays NaN, and lo > hi gives hi, as in PyTorch
      return map<T>(out, x, [lo, hi](A v) {
        const A t = v < lo ? lo : v;
        return t > hi ? hi : t;
      });
    }
  }
}

template <typename T>
void integer_unary(UnaryOp op, const Tensor& out, const Tensor& x, UnaryParams p) {
  switch (op) {
    case UnaryOp::Neg: return map<T>(out, x, [](T v) { return T(-v); });
    case UnaryOp::Abs: return map<T>(out, x, [](T v) { return T(v < 0 ? -v : v); });
    case UnaryOp::Relu: return map<T>(out, x, [](T v) { return T(v < 0 ? 0 : v); });
    case UnaryOp::Clamp: {
      const T lo = int_lower_bound<T>(p.a), hi = int_upper_bound<T>(p.b);
      return map<T>(out, x, [lo, hi](T v) {
        const T t = v < lo ? lo : v;
        return t > hi ? hi : t;
      });
    }
    default: EMBER_FAIL(native::op_name(op), ": not supported for ", dtype_name(out.dtype()), " tensors");
  }
}

void unary_cpu(UnaryOp op, const Tensor& out, const Tensor& x, UnaryParams p) {
  visit_all(out.dtype(), native::op_name(op), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t>) {
      integer_unary<T>(op, out, x, p);
    } else if constexpr (std::is_same_v<T, bool>) {
      EMBER_FAIL(native::op_name(op), ": not supported for bool tensors");
    } else {
      floating_unary<T>(op, out, x, p);
    }
  });
}

// grad_in = f(grad_out, saved) over same-shaped operands.
template <typename T, typename F>
void zip(const Tensor& grad_in, const Tensor& grad_out, const Tensor& saved, const F& f) {
  StridedLoop loop(grad_in.shape(), {grad_in, grad_out, saved});
  binary_loop<T, T, T>(loop, f);
}

template <typename T>
void floating_unary_backward(UnaryOp op, const Tensor& gi, const Tensor& go, const Tensor& s, UnaryParams p) {
  using A = acc_t<T>;
  switch (op) {
    case UnaryOp::Neg: return zip<T>(gi, go, s, [](A g, A) { return -g; });
    case UnaryOp::Exp: return zip<T>(gi, go, s, [](A g, A y) { return g * y; });
    case UnaryOp::Log: return zip<T>(gi, go, s, [](A g, A x) { return g / x; });
    case UnaryOp::Sqrt: return zip<T>(gi, go, s, [](A g, A y) { return g / (A(2) * y); });
    case UnaryOp::Rsqrt: return zip<T>(gi, go, s, [](A g, A y) { return A(-0.5) * g * y * y * y; });
    case UnaryOp::Tanh: return zip<T>(gi, go, s, [](A g, A y) { return g * (A(1) - y * y); });
    case UnaryOp::Sigmoid: return zip<T>(gi, go, s, [](A g, A y) { return g * y * (A(1) - y); });
    case UnaryOp::Relu: return zip<T>(gi, go, s, [](A g, A y) { return y > A(0) ? g : A(0); });
    case UnaryOp::Gelu: return zip<T>(gi, go, s, [](A g, A x) { return g * gelu_grad(x); });
    case UnaryOp::GeluTanh: return zip<T>(gi, go, s, [](A g, A x) { return g * gelu_tanh_grad(x); });
    case UnaryOp::Abs:
      return zip<T>(gi, go, s, [](A g, A x) { return x > A(0) ? g : (x < A(0) ? -g : A(0)); });
    case UnaryOp::PowScalar: {
      const A e = A(p.a), em1 = A(p.a - 1.0);
      if (p.a == 0.0) return zip<T>(gi, go, s, [](A, A) { return A(0); });
      if (p.a == 1.0) return zip<T>(gi, go, s, [](A g, A) { return g; });
      if (p.a == 2.0) return zip<T>(gi, go, s, [](A g, A x) { return A(2) * g * x; });
      return zip<T>(gi, go, s, [e, em1](A g, A x) { return g * e * std::pow(x, em1); });
    }
    case UnaryOp::Clamp: {
      const A lo = A(p.a), hi = A(p.b);
      return zip<T>(gi, go, s, [lo, hi](A g, A x) { return (x >= lo && x <= hi) ? g : A(0); });
    }
  }
}

void unary_backward_cpu(UnaryOp op, const Tensor& grad_in, const Tensor& grad_out, const Tensor& saved,
                        UnaryParams p) {
  visit_floating(grad_in.dtype(), native::op_name(op), [&](auto tag) {
    using T = typename decltype(tag)::type;
    floating_unary_backward<T>(op, grad_in, grad_out, saved, p);
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::unary_stub, CPU, &unary_cpu);
EMBER_REGISTER_KERNEL(native::unary_backward_stub, CPU, &unary_backward_cpu);

}  // namespace ember
