// Differentiable elementwise ops: forward through core/native/elementwise.h, backward formulas
// here. Gradients of broadcasting ops are summed back to each input's shape and returned in
// the input's dtype. Every formula is built from differentiable ops on inputs saved with their
// history (outputs through save_output), so it can be differentiated again (create_graph);
// under no-grad mode those ops are their native calls.
#include <cmath>
#include <limits>

#include "autograd/functions/elementwise_gradients.h"
#include "autograd/node.h"
#include "core/factory.h"
#include "core/grad_mode.h"
#include "core/native/copy.h"
#include "core/native/elementwise.h"
#include "core/native/views.h"
#include "core/ops.h"

namespace ember {
using autograd::sum_to_shape;
using autograd::Tensors;
using native::BinaryOp;
using native::CompareOp;
using native::UnaryOp;
using native::UnaryParams;
using autograd::Backward;

namespace {

// What a backward needs to know about an input without keeping it alive.
struct InputMeta {
  Shape shape;
  DType dtype;
  bool needs;
  explicit InputMeta(const Tensor& t) : shape(t.shape()), dtype(t.dtype()), needs(t.requires_grad()) {}
};

// Sums `g` over the dims that broadcasting added or expanded, giving a tensor of `in.shape`.
Tensor sum_to(const Tensor& g, const InputMeta& in) { return sum_to_shape(g, in.shape).to(in.dtype); }

// The gradient for one input, or none when it needs none.
template <typename F>
Tensor grad_if(const InputMeta& in, const F& compute) {
  return in.needs ? sum_to(compute(), in) : Tensor();
}

Tensor zero_like_scalar(const Tensor& g) { return zeros({}, {g.dtype(), g.device()}); }

// Records `name` when any input needs grad and the output can carry a gradient. Every formula
// recorded through it is differentiable.
void record_if(const char* name, const Tensors& inputs, const Tensor& y, autograd::BackwardFn fn) {
  if (is_floating(y.dtype()) && autograd::needs_grad(inputs))
    autograd::record(name, inputs, {y}, std::move(fn), Backward::differentiable);
}

// What a unary op's formula reads, kept so a second backward can differentiate through it: the
// output as its own node's output, the input with its history; neither where f'' is zero.
autograd::SavedTensor save_for_unary_backward(UnaryOp op, UnaryParams p, const Tensor& x, const Tensor& y) {
  const bool uses_output = native::backward_uses_output(op);
  if (autograd::second_derivative_is_zero(op, p)) return autograd::save(uses_output ? y : x);
  return uses_output ? autograd::save_output(y) : autograd::save_with_history(x);
}

Tensor unary_op(const char* node, UnaryOp op, const Tensor& x, UnaryParams p = {}) {
  Tensor y = native::unary(op, x, p);
  if (is_floating(y.dtype()) && autograd::needs_grad({x})) {
    const autograd::SavedTensor saved = save_for_unary_backward(op, p, x, y);
    autograd::record(
        node, {x}, {y},
        [node, op, p, saved](const Tensors& g) -> Tensors {
          return {autograd::unary_grad(node, op, g[0], saved.unpack(), p)};
        },
        Backward::differentiable);
  }
  return y;
}

// Gradient of maximum (or minimum) for the side that wins where `wins` holds; ties share
// the gradient equally, as PyTorch does.
Tensor extremum_grad(const Tensor& g, const Tensor& wins, const Tensor& ties) {
  Tensor zero = zero_like_scalar(g);
  return where(wins, g, where(ties, mul(g, 0.5), zero));
}

void check_inplace(const Tensor& t, const char* op) {
  EMBER_CHECK(!(GradMode::is_enabled() && t.requires_grad()), op,
              ": in-place update of a tensor that requires grad while grad mode is on; wrap it in "
              "NoGradGuard (as optimizers do) or use the out-of-place op");
}

}  // namespace

// ---- binary arithmetic

Tensor add(const Tensor& a, const Tensor& b, double alpha) {
  Tensor y = native::binary(BinaryOp::Add, a, b, alpha);
  record_if("AddBackward", {a, b}, y, [ma = InputMeta(a), mb = InputMeta(b), alpha](const Tensors& g) -> Tensors {
    return {grad_if(ma, [&] { return g[0]; }),
            grad_if(mb, [&] { return alpha == 1.0 ? g[0] : mul(g[0], alpha); })};
  });
  return y;
}

Tensor sub(const Tensor& a, const Tensor& b, double alpha) {
  Tensor y = native::binary(BinaryOp::Sub, a, b, alpha);
  record_if("SubBackward", {a, b}, y, [ma = InputMeta(a), mb = InputMeta(b), alpha](const Tensors& g) -> Tensors {
    return {grad_if(ma, [&] { return g[0]; }),
            grad_if(mb, [&] { return mul(g[0], -alpha); })};
  });
  return y;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor y = native::binary(BinaryOp::Mul, a, b);
  record_if("MulBackward", {a, b}, y,
            [ma = InputMeta(a), mb = InputMeta(b), sa = autograd::save_with_history(b.requires_grad() ? a : Tensor()),
             sb = autograd::save_with_history(a.requires_grad() ? b : Tensor())](const Tensors& g) -> Tensors {
              return {grad_if(ma, [&] { return mul(g[0], sb.unpack()); }),
                      grad_if(mb, [&] { return mul(g[0], sa.unpack()); })};
            });
  return y;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor y = native::binary(BinaryOp::Div, a, b);
  record_if("DivBackward", {a, b}, y,
            [ma = InputMeta(a), mb = InputMeta(b), sa = autograd::save_with_history(b.requires_grad() ? a : Tensor()),
             sb = autograd::save_with_history(b)](const Tensors& g) -> Tensors {
              // d(a/b)/db = -a / b^2
              const Tensor b_saved = sb.unpack();
              return {grad_if(ma, [&] { return div(g[0], b_saved); }),
                      grad_if(mb, [&] { return neg(div(mul(g[0], sa.unpack()), mul(b_saved, b_saved))); })};
            });
  return y;
}

Tensor add(const Tensor& a, double b) {
  Tensor y = native::binary(BinaryOp::Add, a, b);
  record_if("AddBackward", {a}, y, [ma = InputMeta(a)](const Tensors& g) -> Tensors { return {sum_to(g[0], ma)}; });
  return y;
}

Tensor sub(const Tensor& a, double b) {
  Tensor y = native::binary(BinaryOp::Sub, a, b);
  record_if("SubBackward", {a}, y, [ma = InputMeta(a)](const Tensors& g) -> Tensors { return {sum_to(g[0], ma)}; });
  return y;
}

Tensor mul(const Tensor& a, double b) {
  Tensor y = native::binary(BinaryOp::Mul, a, b);
  record_if("MulBackward", {a}, y, [ma = InputMeta(a), b](const Tensors& g) -> Tensors {
    return {sum_to(mul(g[0], b), ma)};
  });
  return y;
}

Tensor div(const Tensor& a, double b) {
  Tensor y = native::binary(BinaryOp::Div, a, b);
  record_if("DivBackward", {a}, y, [ma = InputMeta(a), b](const Tensors& g) -> Tensors {
    return {sum_to(div(g[0], b), ma)};
  });
  return y;
}

Tensor pow(const Tensor& a, double exponent) { return unary_op("PowBackward", UnaryOp::PowScalar, a, {exponent, 0.0}); }

Tensor pow(const Tensor& a, const Tensor& exponent) {
  Tensor y = native::binary(BinaryOp::Pow, a, exponent);
  record_if("PowBackward", {a, exponent}, y,
            [ma = InputMeta(a), mb = InputMeta(exponent), sa = autograd::save_with_history(a),
             sb = autograd::save_with_history(exponent),
             sy = autograd::save_output(exponent.requires_grad() ? y : Tensor())](const Tensors& g) -> Tensors {
              const Tensor base = sa.unpack(), exponent_saved = sb.unpack();
              return {grad_if(ma, [&] { return mul(g[0], mul(exponent_saved, pow(base, sub(exponent_saved, 1.0)))); }),
                      grad_if(mb, [&] {
                        // d(a^b)/db = a^b log(a); taken as 0 where a == 0 and b >= 0 (the limit)
                        Tensor d = mul(sy.unpack(), log(base));
                        return mul(g[0], masked_fill(d, mul(eq(base, 0.0), ge(exponent_saved, 0.0)), 0.0));
                      })};
            });
  return y;
}

Tensor maximum(const Tensor& a, const Tensor& b) {
  Tensor y = native::binary(BinaryOp::Maximum, a, b);
  record_if("MaximumBackward", {a, b}, y,
            [ma = InputMeta(a), mb = InputMeta(b), sa = autograd::save(a), sb = autograd::save(b)](const Tensors& g) -> Tensors {
              const Tensor a_saved = sa.unpack(), b_saved = sb.unpack();
              const Tensor ties = native::compare(CompareOp::Eq, a_saved, b_saved);
              return {grad_if(ma, [&] { return extremum_grad(g[0], native::compare(CompareOp::Gt, a_saved, b_saved), ties); }),
                      grad_if(mb, [&] { return extremum_grad(g[0], native::compare(CompareOp::Lt, a_saved, b_saved), ties); })};
            });
  return y;
}

Tensor minimum(const Tensor& a, const Tensor& b) {
  Tensor y = native::binary(BinaryOp::Minimum, a, b);
  record_if("MinimumBackward", {a, b}, y,
            [ma = InputMeta(a), mb = InputMeta(b), sa = autograd::save(a), sb = autograd::save(b)](const Tensors& g) -> Tensors {
              const Tensor a_saved = sa.unpack(), b_saved = sb.unpack();
              const Tensor ties = native::compare(CompareOp::Eq, a_saved, b_saved);
              return {grad_if(ma, [&] { return extremum_grad(g[0], native::compare(CompareOp::Lt, a_saved, b_saved), ties); }),
                      grad_if(mb, [&] { return extremum_grad(g[0], native::compare(CompareOp::Gt, a_saved, b_saved), ties); })};
            });
  return y;
}

// ---- unary

Tensor neg(const Tensor& x) {
  Tensor y = native::unary(UnaryOp::Neg, x);
  record_if("NegBackward", {x}, y, [](const Tensors& g) -> Tensors { return {neg(g[0])}; });
  return y;
}

Tensor exp(const Tensor& x) { return unary_op("ExpBackward", UnaryOp::Exp, x); }
Tensor log(const Tensor& x) { return unary_op("LogBackward", UnaryOp::Log, x); }
Tensor sqrt(const Tensor& x) { return unary_op("SqrtBackward", UnaryOp::Sqrt, x); }
Tensor rsqrt(const Tensor& x) { return unary_op("RsqrtBackward", UnaryOp::Rsqrt, x); }
Tensor tanh(const Tensor& x) { return unary_op("TanhBackward", UnaryOp::Tanh, x); }
Tensor sigmoid(const Tensor& x) { return unary_op("SigmoidBackward", UnaryOp::Sigmoid, x); }
Tensor relu(const Tensor& x) { return unary_op("ReluBackward", UnaryOp::Relu, x); }
Tensor leaky_relu(const Tensor& x, double negative_slope) {
  return unary_op("LeakyReluBackward", UnaryOp::LeakyRelu, x, {negative_slope, 0.0});
}
Tensor abs(const Tensor& x) { return unary_op("AbsBackward", UnaryOp::Abs, x); }

Tensor gelu(const Tensor& x, bool tanh_approx) {
  return unary_op("GeluBackward", tanh_approx ? UnaryOp::GeluTanh : UnaryOp::Gelu, x);
}

Tensor silu(const Tensor& x) { return unary_op("SiluBackward", UnaryOp::Silu, x); }

Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max) {
  EMBER_CHECK(min.has_value() || max.has_value(), "clamp: at least one of min and max must be given");
  const double inf = std::numeric_limits<double>::infinity();
  return unary_op("ClampBackward", UnaryOp::Clamp, x, {min.value_or(-inf), max.value_or(inf)});
}

// ---- comparisons and selection

Tensor eq(const Tensor& a, const Tensor& b) { return native::compare(CompareOp::Eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return native::compare(CompareOp::Ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return native::compare(CompareOp::Lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return native::compare(CompareOp::Le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return native::compare(CompareOp::Gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return native::compare(CompareOp::Ge, a, b); }
Tensor eq(const Tensor& a, double b) { return native::compare(CompareOp::Eq, a, b); }
Tensor ne(const Tensor& a, double b) { return native::compare(CompareOp::Ne, a, b); }
Tensor lt(const Tensor& a, double b) { return native::compare(CompareOp::Lt, a, b); }
Tensor le(const Tensor& a, double b) { return native::compare(CompareOp::Le, a, b); }
Tensor gt(const Tensor& a, double b) { return native::compare(CompareOp::Gt, a, b); }
Tensor ge(const Tensor& a, double b) { return native::compare(CompareOp::Ge, a, b); }

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  Tensor y = native::where(cond, a, b);
  record_if("WhereBackward", {a, b}, y,
            [ma = InputMeta(a), mb = InputMeta(b), sc = autograd::save(cond)](const Tensors& g) -> Tensors {
              const Tensor zero = zero_like_scalar(g[0]);
              const Tensor cond_saved = sc.unpack();
              return {grad_if(ma, [&] { return where(cond_saved, g[0], zero); }),
                      grad_if(mb, [&] { return where(cond_saved, zero, g[0]); })};
            });
  return y;
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  Tensor y = native::masked_fill(x, mask, value);
  record_if("MaskedFillBackward", {x}, y, [sm = autograd::save(mask)](const Tensors& g) -> Tensors {
    return {masked_fill(g[0], sm.unpack(), 0.0)};
  });
  return y;
}

// ---- Tensor members

Tensor& Tensor::add_(const Tensor& other, double alpha) {
  check_inplace(*this, "add_");
  const Shape target = broadcast_shapes(shape(), other.shape(), "add_");
  EMBER_CHECK(target == shape(), "add_: other of shape ", other.shape(), " cannot be broadcast to self's shape ",
              shape());
  native::binary(BinaryOp::Add, *this, other, alpha, *this);
  return *this;
}

Tensor& Tensor::mul_(double value) {
  check_inplace(*this, "mul_");
  native::binary(BinaryOp::Mul, *this, value, *this);
  return *this;
}

Tensor Tensor::neg() const { return ember::neg(*this); }
Tensor Tensor::exp() const { return ember::exp(*this); }
Tensor Tensor::log() const { return ember::log(*this); }
Tensor Tensor::sqrt() const { return ember::sqrt(*this); }
Tensor Tensor::rsqrt() const { return ember::rsqrt(*this); }
Tensor Tensor::tanh() const { return ember::tanh(*this); }
Tensor Tensor::sigmoid() const { return ember::sigmoid(*this); }
Tensor Tensor::relu() const { return ember::relu(*this); }
Tensor Tensor::gelu(bool tanh_approx) const { return ember::gelu(*this, tanh_approx); }
Tensor Tensor::abs() const { return ember::abs(*this); }
Tensor Tensor::pow(double exponent) const { return ember::pow(*this, exponent); }
Tensor Tensor::clamp(double min, double max) const { return ember::clamp(*this, min, max); }
Tensor Tensor::masked_fill(const Tensor& mask, double value) const { return ember::masked_fill(*this, mask, value); }

}  // namespace ember
