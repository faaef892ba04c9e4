// CPU kernels of the one-operand elementwise ops and their fused backward
// (grad_in = grad_out * f'(x)). Half types compute in float.
//
// float exp, tanh, sigmoid and gelu use the branch-free approximations below rather than libm
// calls, so that GCC turns each loop into AVX2 code; gelu (both forms) and its backward are
// written with explicit 8-lane vectors (kernels/cpu/gelu_math.h) for f32, bf16 and f16 data,
// 16-lane ones (kernels/cpu/gelu_avx512.h) for f32 and bf16 where the CPU has AVX-512. That needs
// FP compares and conversions to be treated as non-trapping, which is safe because nothing reads
// the FP exception flags.
//
// Measured on AMD EPYC Zen 3 (AVX2), one thread, 4M f32 (build/bench/bench_ops BM_Gelu and
// BM_GeluTanh; best of many runs on a shared machine): exact gelu 0.96 ns per element (8.3 GB/s,
// 0.38 of the 22 GB/s memory copy bandwidth; 2.3 ns before its lane formula was forced inline
// and its polynomials shortened), tanh form 0.69 ns (11.6 GB/s, as x sigmoid(2u): one exp and
// one divide; 1.25 ns through tanh, old and new alternating). The exact form is compute-bound, on
// the two FMA ports: its erfc as exp times a rational function of |x| (every multiply-add an
// FMA) takes 0.66 ns per element in L1 against the 1.01 of the degree-9 polynomial in
// 1 / (1 + |x| / (2 sqrt2)) before it, and its derivative 0.82 against 1.03 (CPU time, old and new
// alternating; 10.7 GB/s against 8.2 in BM_Gelu's CPU time on one thread).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <type_traits>

#include "core/cpu_features.h"
#include "core/native/elementwise.h"
#include "core/strided_loop.h"
#include "core/type_dispatch.h"
#include "kernels/cpu/gelu_avx512.h"
#include "kernels/cpu/gelu_math.h"
#include "kernels/cpu/streamed_output.h"
#include "kernels/cpu/vec_half.h"
#include "kernels/shared/unary_fn.h"

// The approximations must inline into the loops to vectorise; GCC's size heuristics would
// otherwise keep them out of line once they have many callers.
#if defined(__GNUC__)
#define EMBER_VEC_INLINE [[gnu::always_inline]] inline
#else
#define EMBER_VEC_INLINE inline
#endif

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
EMBER_VEC_INLINE float pow2i(int32_t n) { return std::bit_cast<float>(uint32_t(n + 127) << 23); }

// e^x = 2^n e^r with n = round(x / ln2), |r| <= ln2 / 2, e^r by a degree-7 polynomial
// (Cephes' expf coefficients). Saturates to 0 and inf; NaN passes through.
EMBER_VEC_INLINE float fast_exp(float x) {
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
EMBER_VEC_INLINE float fast_tanh(float x) {
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

template <typename A> EMBER_VEC_INLINE A exp_of(A x) {
  if constexpr (std::is_same_v<A, float>) return fast_exp(x);
  else return std::exp(x);
}
template <typename A> EMBER_VEC_INLINE A tanh_of(A x) {
  if constexpr (std::is_same_v<A, float>) return fast_tanh(x);
  else return std::tanh(x);
}

template <typename A> EMBER_VEC_INLINE A sigmoid_of(A x) { return A(1) / (A(1) + exp_of(-x)); }
// silu: x sigmoid(x); derivative s (1 + x (1 - s)) with s = sigmoid(x).
template <typename A> EMBER_VEC_INLINE A silu_of(A x) { return x * sigmoid_of(x); }
template <typename A> EMBER_VEC_INLINE A silu_grad(A x) {
  const A s = sigmoid_of(x);
  return s * (A(1) + x * (A(1) - s));
}

// tanh-form gelu: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
template <typename A> EMBER_VEC_INLINE A gelu_tanh_of(A x) {
  return A(0.5) * x * (A(1) + tanh_of(kSqrt2OverPi<A> * (x + kGeluCubic<A> * x * x * x)));
}
template <typename A> EMBER_VEC_INLINE A gelu_tanh_grad(A x) {
  const A x2 = x * x;
  const A t = tanh_of(kSqrt2OverPi<A> * x * (A(1) + kGeluCubic<A> * x2));
  const A dinner = kSqrt2OverPi<A> * (A(1) + A(3) * kGeluCubic<A> * x2);
  return A(0.5) * (A(1) + t) + A(0.5) * x * (A(1) - t * t) * dinner;
}

// erf-form gelu: x Phi(x), Phi the standard normal CDF; derivative Phi(x) + x phi(x). float takes
// the lane formulas of kernels/cpu/gelu_math.h on one lane, so it rounds exactly as the vector loops.
template <typename A> EMBER_VEC_INLINE A gelu_of(A x) {
  if constexpr (std::is_same_v<A, float>) return cpu::vec8::gelu8(cpu::vec8::f8{} + x)[0];
  else return x * (A(0.5) * std::erfc(-x * kSqrtHalf<A>));
}
template <typename A> EMBER_VEC_INLINE A gelu_grad(A x) {
  if constexpr (std::is_same_v<A, float>) return cpu::vec8::gelu_grad8(cpu::vec8::f8{} + x)[0];
  else return A(0.5) * std::erfc(-x * kSqrtHalf<A>) + x * kInvSqrt2Pi<A> * exp_of(A(-0.5) * x * x);
}

using kernels::int_lower_bound;
using kernels::int_upper_bound;

// The element functions, one per kernel (pow with exponents 1 and 2 gets its own cheap form).
using Fn = kernels::UnaryFn;

// f(v); a and b are pow's exponent or clamp's bounds, a leaky_relu's slope.
template <Fn F, typename A>
EMBER_VEC_INLINE A forward_fn(A v, A a, A b) {
  if constexpr (F == Fn::Neg) return -v;
  else if constexpr (F == Fn::Exp) return exp_of(v);
  else if constexpr (F == Fn::Log) return std::log(v);
  else if constexpr (F == Fn::Sqrt) return std::sqrt(v);
  else if constexpr (F == Fn::Rsqrt) return A(1) / std::sqrt(v);
  else if constexpr (F == Fn::Tanh) return tanh_of(v);
  else if constexpr (F == Fn::Sigmoid) return sigmoid_of(v);
  else if constexpr (F == Fn::Relu) return v < A(0) ? A(0) : v;  // NaN stays NaN
  else if constexpr (F == Fn::Gelu) return gelu_of(v);
  else if constexpr (F == Fn::GeluTanh) return gelu_tanh_of(v);
  else if constexpr (F == Fn::Silu) return silu_of(v);
  else if constexpr (F == Fn::Abs) return std::abs(v);
  else if constexpr (F == Fn::Identity) return v;
  else if constexpr (F == Fn::Square) return v * v;
  else if constexpr (F == Fn::Pow) return std::pow(v, a);
  else if constexpr (F == Fn::LeakyRelu) return v > A(0) ? v : v * a;  // NaN stays NaN
  else {
    // min(max(v, a), b): NaN stays NaN, and a > b gives b, as in PyTorch
    const A t = v < a ? a : v;
    return t > b ? b : t;
  }
}

// grad * f'(x), where `s` is the saved output for Exp, Sqrt, Rsqrt, Tanh, Sigmoid and Relu and
// the input otherwise.
template <Fn F, typename A>
EMBER_VEC_INLINE A backward_fn(A g, A s, A a, A b) {
  if constexpr (F == Fn::Neg) return -g;
  else if constexpr (F == Fn::Exp) return g * s;
  else if constexpr (F == Fn::Log) return g / s;
  else if constexpr (F == Fn::Sqrt) return g / (A(2) * s);
  else if constexpr (F == Fn::Rsqrt) return A(-0.5) * g * s * s * s;
  else if constexpr (F == Fn::Tanh) return g * (A(1) - s * s);
  else if constexpr (F == Fn::Sigmoid) return g * s * (A(1) - s);
  else if constexpr (F == Fn::Relu) return s > A(0) ? g : A(0);
  else if constexpr (F == Fn::Gelu) return g * gelu_grad(s);
  else if constexpr (F == Fn::GeluTanh) return g * gelu_tanh_grad(s);
  else if constexpr (F == Fn::Silu) return g * silu_grad(s);
  else if constexpr (F == Fn::Abs) return s > A(0) ? g : (s < A(0) ? -g : A(0));
  else if constexpr (F == Fn::Identity) return g;
  else if constexpr (F == Fn::Square) return A(2) * g * s;
  else if constexpr (F == Fn::Pow) return a == A(0) ? A(0) : g * a * std::pow(s, a - A(1));
  else if constexpr (F == Fn::LeakyRelu) return s > A(0) ? g : g * a;  // the slope at 0, as in PyTorch
  else return (s >= a && s <= b) ? g : A(0);  // passes the gradient on the bounds too
}

template <typename T, Fn F>
void forward_kernel(const Tensor& out, const Tensor& x, acc_t<T> a, acc_t<T> b) {
  using A = acc_t<T>;
  StridedLoop loop(out.shape(), {out, x});
  loop.run([&](char** p, const int64_t* s, int64_t n) {
    if (s[0] == sizeof(T) && s[1] == sizeof(T)) {
      T* o = reinterpret_cast<T*>(p[0]);
      const T* v = reinterpret_cast<const T*>(p[1]);
      for (int64_t i = 0; i < n; ++i) o[i] = T(forward_fn<F>(A(v[i]), a, b));
    } else {
      for (int64_t i = 0; i < n; ++i)
        *reinterpret_cast<T*>(p[0] + i * s[0]) = T(forward_fn<F>(A(*reinterpret_cast<const T*>(p[1] + i * s[1])), a, b));
    }
  });
}

template <typename T, Fn F>
void backward_kernel(const Tensor& gi, const Tensor& go, const Tensor& saved, acc_t<T> a, acc_t<T> b) {
  using A = acc_t<T>;
  StridedLoop loop(gi.shape(), {gi, go, saved});
  loop.run([&](char** p, const int64_t* s, int64_t n) {
    if (s[0] == sizeof(T) && s[1] == sizeof(T) && s[2] == sizeof(T)) {
      T* o = reinterpret_cast<T*>(p[0]);
      const T* g = reinterpret_cast<const T*>(p[1]);
      const T* v = reinterpret_cast<const T*>(p[2]);
      for (int64_t i = 0; i < n; ++i) o[i] = T(backward_fn<F>(A(g[i]), A(v[i]), a, b));
    } else {
      for (int64_t i = 0; i < n; ++i) {
        const A g = A(*reinterpret_cast<const T*>(p[1] + i * s[1]));
        const A v = A(*reinterpret_cast<const T*>(p[2] + i * s[2]));
        *reinterpret_cast<T*>(p[0] + i * s[0]) = T(backward_fn<F>(g, v, a, b));
      }
    }
  });
}

// ---- gelu, both forms, on float lanes (f32, bf16 and f16 data)

template <typename T>
constexpr bool is_lane_type_v = std::is_same_v<T, float> || std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>;

template <bool Tanh>
EMBER_VEC_INLINE cpu::vec8::f8 gelu_lanes8(cpu::vec8::f8 v) {
  if constexpr (Tanh) return cpu::vec8::gelu_tanh8(v);
  else return cpu::vec8::gelu8(v);
}
template <bool Tanh>
EMBER_VEC_INLINE cpu::vec8::f8 gelu_grad_lanes8(cpu::vec8::f8 v) {
  if constexpr (Tanh) return cpu::vec8::gelu_tanh_grad8(v);
  else return cpu::vec8::gelu_grad8(v);
}

// Strided rows go through a small float buffer, 8 elements at a time.
template <typename T, bool Tanh>
void gelu_forward_kernel(const Tensor& out, const Tensor& x) {
  using namespace cpu::vec8;
  const bool avx512 = cpu_capability() == CpuCapability::Avx512;
  const bool stream = cpu::stream_output(out.numel() * int64_t(sizeof(T)));
  StridedLoop loop(out.shape(), {out, x});
  loop.run([&](char** p, const int64_t* s, int64_t n) {
    if (s[0] == sizeof(T) && s[1] == sizeof(T)) {
      T* o = reinterpret_cast<T*>(p[0]);
      const T* v = reinterpret_cast<const T*>(p[1]);
      if constexpr (std::is_same_v<T, float>) {
        if (avx512) return cpu::gelu_forward_row_avx512(o, v, nullptr, n, Tanh, stream);
      } else if constexpr (std::is_same_v<T, BFloat16>) {
        if (avx512) return cpu::gelu_forward_row_avx512(o, v, nullptr, n, Tanh);
      }
      int64_t i = 0;
      for (; i + kLanes <= n; i += kLanes) store8(o + i, gelu_lanes8<Tanh>(load8(v + i)));
      if (i < n) store_part(o + i, gelu_lanes8<Tanh>(load_part(v + i, n - i, 0.0f)), n - i);
      return;
    }
    for (int64_t i = 0; i < n; i += kLanes) {
      const int64_t len = std::min<int64_t>(kLanes, n - i);
      float buf[kLanes] = {};
      for (int64_t k = 0; k < len; ++k) buf[k] = float(*reinterpret_cast<const T*>(p[1] + (i + k) * s[1]));
      const f8 y = gelu_lanes8<Tanh>(load8(buf));
      for (int64_t k = 0; k < len; ++k) *reinterpret_cast<T*>(p[0] + (i + k) * s[0]) = T(y[k]);
    }
  });
}

template <typename T, bool Tanh>
void gelu_backward_kernel(const Tensor& gi, const Tensor& go, const Tensor& x) {
  using namespace cpu::vec8;
  const bool avx512 = cpu_capability() == CpuCapability::Avx512;
  StridedLoop loop(gi.shape(), {gi, go, x});
  loop.run([&](char** p, const int64_t* s, int64_t n) {
    if (s[0] == sizeof(T) && s[1] == sizeof(T) && s[2] == sizeof(T)) {
      T* o = reinterpret_cast<T*>(p[0]);
      const T* g = reinterpret_cast<const T*>(p[1]);
      const T* v = reinterpret_cast<const T*>(p[2]);
      if constexpr (!std::is_same_v<T, Half>) {
        if (avx512) return cpu::gelu_backward_row_avx512(o, g, v, nullptr, n, Tanh);
      }
      int64_t i = 0;
      for (; i + kLanes <= n; i += kLanes) store8(o + i, load8(g + i) * gelu_grad_lanes8<Tanh>(load8(v + i)));
      if (i < n)
        store_part(o + i, load_part(g + i, n - i, 0.0f) * gelu_grad_lanes8<Tanh>(load_part(v + i, n - i, 0.0f)), n - i);
      return;
    }
    for (int64_t i = 0; i < n; i += kLanes) {
      const int64_t len = std::min<int64_t>(kLanes, n - i);
      float gb[kLanes] = {}, xb[kLanes] = {};
      for (int64_t k = 0; k < len; ++k) {
        gb[k] = float(*reinterpret_cast<const T*>(p[1] + (i + k) * s[1]));
        xb[k] = float(*reinterpret_cast<const T*>(p[2] + (i + k) * s[2]));
      }
      const f8 d = load8(gb) * gelu_grad_lanes8<Tanh>(load8(xb));
      for (int64_t k = 0; k < len; ++k) *reinterpret_cast<T*>(p[0] + (i + k) * s[0]) = T(d[k]);
    }
  });
}


template <typename T>
void integer_unary(UnaryOp op, const Tensor& out, const Tensor& x, UnaryParams p) {
  switch (op) {
    case UnaryOp::Neg: return forward_kernel<T, Fn::Neg>(out, x, 0, 0);
    case UnaryOp::Abs: return forward_kernel<T, Fn::Abs>(out, x, 0, 0);
    case UnaryOp::Relu: return forward_kernel<T, Fn::Relu>(out, x, 0, 0);
    case UnaryOp::Clamp: return forward_kernel<T, Fn::Clamp>(out, x, int_lower_bound<T>(p.a), int_upper_bound<T>(p.b));
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
      using A = acc_t<T>;
      if constexpr (is_lane_type_v<T>) {
        if (op == UnaryOp::Gelu) return gelu_forward_kernel<T, false>(out, x);
        if (op == UnaryOp::GeluTanh) return gelu_forward_kernel<T, true>(out, x);
      }
      kernels::with_unary_fn(kernels::select_unary_fn(op, p),
                             [&](auto f) { forward_kernel<T, decltype(f)::value>(out, x, A(p.a), A(p.b)); });
    }
  });
}

void unary_backward_cpu(UnaryOp op, const Tensor& grad_in, const Tensor& grad_out, const Tensor& saved,
                        UnaryParams p) {
  visit_floating(grad_in.dtype(), native::op_name(op), [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    if constexpr (is_lane_type_v<T>) {
      if (op == UnaryOp::Gelu) return gelu_backward_kernel<T, false>(grad_in, grad_out, saved);
      if (op == UnaryOp::GeluTanh) return gelu_backward_kernel<T, true>(grad_in, grad_out, saved);
    }
    kernels::with_unary_fn(kernels::select_unary_fn(op, p), [&](auto f) {
      backward_kernel<T, decltype(f)::value>(grad_in, grad_out, saved, A(p.a), A(p.b));
    });
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::unary_stub, CPU, &unary_cpu);
EMBER_REGISTER_KERNEL(native::unary_backward_stub, CPU, &unary_backward_cpu);

}  // namespace ember
