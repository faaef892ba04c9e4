// Elementwise ops without autograd: broadcasting, dtype promotion, output allocation, and the
// dispatch to the device kernels. autograd/functions/elementwise.cpp wraps these with their
// backward formulas.
//
// Dtype rules (PyTorch's): two tensors promote with promote_types; `div` of integers is true
// division into float32; a scalar keeps the tensor's dtype, except that a non-integral scalar
// with an integer tensor gives float32 (a double cannot tell 2 from 2.0, so integral values stay
// integral). Transcendental unary ops (exp, log, sqrt, rsqrt, tanh, sigmoid, gelu, silu) and pow turn
// integer input into float32.
#pragma once
#include <cstdint>
#include <limits>

#include "core/dispatch.h"
#include "core/tensor.h"

namespace ember::native {

enum class BinaryOp : uint8_t { Add, Sub, Mul, Div, Pow, Maximum, Minimum };
enum class CompareOp : uint8_t { Eq, Ne, Lt, Le, Gt, Ge };
enum class UnaryOp : uint8_t {
  Neg, Exp, Log, Sqrt, Rsqrt, Tanh, Sigmoid, Relu, Gelu, GeluTanh, Silu, Abs,
  PowScalar,  // x ^ p.a
  Clamp,      // min(max(x, p.a), p.b); absent bounds are -inf / +inf
  LeakyRelu,  // x > 0 ? x : p.a * x; floating-point input only
};

// Extra arguments of the parameterised unary ops.
struct UnaryParams {
  double a = 0.0;
  double b = 0.0;
};

const char* op_name(BinaryOp op);
const char* op_name(CompareOp op);
const char* op_name(UnaryOp op);

// out = a op b with a, b broadcast to out's shape by strides; a, b and out share one dtype.
// For Add/Sub the right operand is scaled by alpha first.
EMBER_DECLARE_STUB(binary_stub, void (*)(BinaryOp op, const Tensor& out, const Tensor& a,
                                         const Tensor& b, double alpha));
// out = a op s; a and out share one dtype, out has a's shape.
EMBER_DECLARE_STUB(binary_scalar_stub, void (*)(BinaryOp op, const Tensor& out, const Tensor& a, double s));
// out (bool) = a op b; a and b share one dtype.
EMBER_DECLARE_STUB(compare_stub, void (*)(CompareOp op, const Tensor& out, const Tensor& a, const Tensor& b));
EMBER_DECLARE_STUB(compare_scalar_stub, void (*)(CompareOp op, const Tensor& out, const Tensor& a, double s));
// out = f(x); same dtype and shape.
EMBER_DECLARE_STUB(unary_stub, void (*)(UnaryOp op, const Tensor& out, const Tensor& x, UnaryParams p));
// grad_in = grad_out * f'(...), fused. `saved` is the op's output for Exp, Sqrt, Rsqrt, Tanh,
// Sigmoid and Relu, its input otherwise (unused for Neg). All three share dtype and shape.
EMBER_DECLARE_STUB(unary_backward_stub, void (*)(UnaryOp op, const Tensor& grad_in, const Tensor& grad_out,
                                                 const Tensor& saved, UnaryParams p));
// out = cond ? a : b; cond bool; a, b, out share one dtype; all broadcast to out's shape.
EMBER_DECLARE_STUB(where_stub, void (*)(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b));
// out = mask ? value : x; mask bool, broadcast to out's shape; x and out share dtype and shape.
EMBER_DECLARE_STUB(masked_fill_stub, void (*)(const Tensor& out, const Tensor& x, const Tensor& mask, double value));

// True when the unary op's backward reads its output rather than its input.
bool backward_uses_output(UnaryOp op);

// The dtype a binary op computes and returns in.
DType binary_result_type(BinaryOp op, DType a, DType b);
DType binary_result_type(BinaryOp op, DType a, double s);

// a op b (a + alpha*b for Add, a - alpha*b for Sub). When `out` is given the result is written
// there (it must have the broadcast shape; its dtype may differ if the result converts to it
// without turning float into integer) and `out` is returned; it may be `a` itself.
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b, double alpha = 1.0, const Tensor& out = Tensor());
Tensor binary(BinaryOp op, const Tensor& a, double s, const Tensor& out = Tensor());
Tensor compare(CompareOp op, const Tensor& a, const Tensor& b);
Tensor compare(CompareOp op, const Tensor& a, double s);
Tensor unary(UnaryOp op, const Tensor& x, UnaryParams p = {});
// Gradient of unary(op, x, p) given grad_out and `saved` (see backward_uses_output); the result
// has saved's dtype and shape.
Tensor unary_backward(UnaryOp op, const Tensor& grad_out, const Tensor& saved, UnaryParams p = {});
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);

}  // namespace ember::native
