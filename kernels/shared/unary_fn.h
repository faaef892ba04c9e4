// The element functions behind the unary ops, shared by the CPU and CUDA kernels: which one an
// (op, parameters) pair runs, and a switch that turns the runtime choice into a compile-time
// constant so each kernel is instantiated once per function. pow with exponent 1 or 2 becomes
// the identity or a square, which are exact and cheap on every device.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "core/error.h"
#include "core/native/elementwise.h"

namespace ember::kernels {

enum class UnaryFn : uint8_t {
  Neg, Exp, Log, Sqrt, Rsqrt, Tanh, Sigmoid, Relu, Gelu, GeluTanh, Silu, Abs, Identity, Square, Pow, Clamp,
  LeakyRelu
};

inline UnaryFn select_unary_fn(native::UnaryOp op, native::UnaryParams p) {
  using native::UnaryOp;
  switch (op) {
    case UnaryOp::Neg: return UnaryFn::Neg;
    case UnaryOp::Exp: return UnaryFn::Exp;
    case UnaryOp::Log: return UnaryFn::Log;
    case UnaryOp::Sqrt: return UnaryFn::Sqrt;
    case UnaryOp::Rsqrt: return UnaryFn::Rsqrt;
    case UnaryOp::Tanh: return UnaryFn::Tanh;
    case UnaryOp::Sigmoid: return UnaryFn::Sigmoid;
    case UnaryOp::Relu: return UnaryFn::Relu;
    case UnaryOp::Gelu: return UnaryFn::Gelu;
    case UnaryOp::GeluTanh: return UnaryFn::GeluTanh;
    case UnaryOp::Silu: return UnaryFn::Silu;
    case UnaryOp::Abs: return UnaryFn::Abs;
    case UnaryOp::PowScalar: return p.a == 1.0 ? UnaryFn::Identity : p.a == 2.0 ? UnaryFn::Square : UnaryFn::Pow;
    case UnaryOp::Clamp: return UnaryFn::Clamp;
    case UnaryOp::LeakyRelu: return UnaryFn::LeakyRelu;
  }
  EMBER_FAIL(native::op_name(op), ": unknown unary op");
}

// Calls run(std::integral_constant<UnaryFn, F>) for the runtime value f.
template <typename Run>
void with_unary_fn(UnaryFn f, const Run& run) {
  switch (f) {
#define EMBER_UNARY_FN_CASE(name) \
  case UnaryFn::name: return run(std::integral_constant<UnaryFn, UnaryFn::name>{});
    EMBER_UNARY_FN_CASE(Neg) EMBER_UNARY_FN_CASE(Exp) EMBER_UNARY_FN_CASE(Log) EMBER_UNARY_FN_CASE(Sqrt)
    EMBER_UNARY_FN_CASE(Rsqrt) EMBER_UNARY_FN_CASE(Tanh) EMBER_UNARY_FN_CASE(Sigmoid) EMBER_UNARY_FN_CASE(Relu)
    EMBER_UNARY_FN_CASE(Gelu) EMBER_UNARY_FN_CASE(GeluTanh) EMBER_UNARY_FN_CASE(Silu) EMBER_UNARY_FN_CASE(Abs)
    EMBER_UNARY_FN_CASE(Identity) EMBER_UNARY_FN_CASE(Square) EMBER_UNARY_FN_CASE(Pow) EMBER_UNARY_FN_CASE(Clamp)
    EMBER_UNARY_FN_CASE(LeakyRelu)
#undef EMBER_UNARY_FN_CASE
  }
}

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

}  // namespace ember::kernels
