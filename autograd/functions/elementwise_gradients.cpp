// Second derivatives of the unary ops, in terms of what their backward saves (the output y for
// exp, sqrt, rsqrt, tanh and sigmoid, the input x otherwise): d/dsaved of g * f'(saved).
#include "autograd/functions/elementwise_gradients.h"

#include <string>

#include "autograd/node.h"
#include "core/ops.h"

namespace ember::autograd {
using native::UnaryOp;
using native::UnaryParams;

namespace {

constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1 / sqrt(2 pi)
constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2 / pi), gelu's tanh form
constexpr double kGeluCubic = 0.044715;

// 1 - t
Tensor one_minus(const Tensor& t) { return add(neg(t), 1.0); }

// d(g f'(s)) / ds times h, given hg = h * g; undefined where f'' is zero.
Tensor saved_term(UnaryOp op, const Tensor& hg, const Tensor& s, UnaryParams p) {
  switch (op) {
    case UnaryOp::Exp: return hg;                                             // g y
    case UnaryOp::Log: return neg(div(hg, mul(s, s)));                        // g / x
    case UnaryOp::Sqrt: return neg(div(hg, mul(mul(s, s), 2.0)));            // g / (2 y)
    case UnaryOp::Rsqrt: return mul(hg, mul(mul(s, s), -1.5));               // -g y^3 / 2
    case UnaryOp::Tanh: return mul(hg, mul(s, -2.0));                        // g (1 - y^2)
    case UnaryOp::Sigmoid: return mul(hg, one_minus(mul(s, 2.0)));           // g y (1 - y)
    case UnaryOp::Gelu: {                                                    // g (Phi(x) + x phi(x))
      const Tensor x2 = mul(s, s);
      const Tensor phi = mul(exp(mul(x2, -0.5)), kInvSqrt2Pi);
      return mul(hg, mul(phi, add(neg(x2), 2.0)));
    }
    case UnaryOp::GeluTanh: {  // u = k (x + c x^3), t = tanh(u): f'' = (1 - t^2) (u' + x (u'' - 2 t u'^2) / 2)
      const Tensor x2 = mul(s, s);
      const Tensor t = tanh(mul(mul(s, add(mul(x2, kGeluCubic), 1.0)), kSqrt2OverPi));
      const Tensor du = mul(add(mul(x2, 3.0 * kGeluCubic), 1.0), kSqrt2OverPi);
      const Tensor curvature = sub(mul(s, 6.0 * kGeluCubic * kSqrt2OverPi), mul(mul(t, 2.0), mul(du, du)));
      return mul(hg, mul(one_minus(mul(t, t)), add(du, mul(mul(s, 0.5), curvature))));
    }
    case UnaryOp::Silu: {  // g sig (1 + x (1 - sig)); f'' = sig (1 - sig) (2 + x (1 - 2 sig))
      const Tensor sig = sigmoid(s);
      return mul(hg, mul(mul(sig, one_minus(sig)), add(mul(s, one_minus(mul(sig, 2.0))), 2.0)));
    }
    case UnaryOp::PowScalar:  // g a x^(a - 1)
      return second_derivative_is_zero(op, p) ? Tensor() : mul(hg, mul(pow(s, p.a - 2.0), p.a * (p.a - 1.0)));
    default: return Tensor();
  }
}

}  // namespace

bool second_derivative_is_zero(UnaryOp op, UnaryParams p) {
  switch (op) {
    case UnaryOp::Neg:
    case UnaryOp::Relu:
    case UnaryOp::LeakyRelu:
    case UnaryOp::Abs:
    case UnaryOp::Clamp: return true;
    case UnaryOp::PowScalar: return p.a == 0.0 || p.a == 1.0;
    default: return false;
  }
}

Tensor unary_grad(const char* node, UnaryOp op, const Tensor& grad_out, const Tensor& saved, UnaryParams p) {
  Tensor grad_in = native::unary_backward(op, grad_out, saved, p);
  if (!needs_grad({grad_out, saved})) return grad_in;
  const bool want_g = grad_out.requires_grad(), want_s = saved.requires_grad();
  std::string name = std::string(node) + "Backward";
  // saved is read for both gradients; grad_out only for saved's.
  record(
      name, {grad_out, saved}, {grad_in},
      [name, op, p, want_g, want_s, g_dtype = grad_out.dtype(), sg = save_with_history(want_s ? grad_out : Tensor()),
       ss = save_with_history(saved)](const Tensors& h) -> Tensors {
        const Tensor s = ss.unpack();
        Tensor dg, ds;
        if (want_g) dg = unary_grad(name.c_str(), op, h[0], s, p).to(g_dtype);
        if (want_s) {
          ds = saved_term(op, mul(h[0], sg.unpack()), s, p);
          if (ds.defined()) ds = ds.to(s.dtype());
        }
        return {dg, ds};
      },
      Backward::differentiable);
  return grad_in;
}

Tensor sum_to_shape(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  const int64_t lead = g.dim() - int64_t(shape.size());
  Shape dims;
  for (int64_t i = 0; i < g.dim(); ++i)
    if (i < lead || (shape[size_t(i - lead)] == 1 && g.shape()[size_t(i)] != 1)) dims.push_back(i);
  const Tensor s = dims.empty() ? g : sum(g, dims, /*keepdim=*/true);
  return s.reshape(shape);
}

}  // namespace ember::autograd
