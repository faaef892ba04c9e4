#include "core/native/elementwise.h"

#include <cmath>

#include "core/native/copy.h"

namespace ember::native {

EMBER_DEFINE_STUB(binary_stub);
EMBER_DEFINE_STUB(binary_scalar_stub);
EMBER_DEFINE_STUB(compare_stub);
EMBER_DEFINE_STUB(compare_scalar_stub);
EMBER_DEFINE_STUB(unary_stub);
EMBER_DEFINE_STUB(unary_backward_stub);
EMBER_DEFINE_STUB(where_stub);
EMBER_DEFINE_STUB(masked_fill_stub);

const char* op_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::Add: return "add";
    case BinaryOp::Sub: return "sub";
    case BinaryOp::Mul: return "mul";
    case BinaryOp::Div: return "div";
    case BinaryOp::Pow: return "pow";
    case BinaryOp::Maximum: return "maximum";
    case BinaryOp::Minimum: return "minimum";
  }
  return "?";
}

const char* op_name(CompareOp op) {
  switch (op) {
    case CompareOp::Eq: return "eq";
    case CompareOp::Ne: return "ne";
    case CompareOp::Lt: return "lt";
    case CompareOp::Le: return "le";
    case CompareOp::Gt: return "gt";
    case CompareOp::Ge: return "ge";
  }
  return "?";
}

const char* op_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::Neg: return "neg";
    case UnaryOp::Exp: return "exp";
    case UnaryOp::Log: return "log";
    case UnaryOp::Sqrt: return "sqrt";
    case UnaryOp::Rsqrt: return "rsqrt";
    case UnaryOp::Tanh: return "tanh";
    case UnaryOp::Sigmoid: return "sigmoid";
    case UnaryOp::Relu: return "relu";
    case UnaryOp::Gelu: return "gelu";
    case UnaryOp::GeluTanh: return "gelu";
    case UnaryOp::Silu: return "silu";
    case UnaryOp::Abs: return "abs";
    case UnaryOp::PowScalar: return "pow";
    case UnaryOp::Clamp: return "clamp";
    case UnaryOp::LeakyRelu: return "leaky_relu";
  }
  return "?";
}

bool backward_uses_output(UnaryOp op) {
  switch (op) {
    case UnaryOp::Exp:
    case UnaryOp::Sqrt:
    case UnaryOp::Rsqrt:
    case UnaryOp::Tanh:
    case UnaryOp::Sigmoid:
    case UnaryOp::Relu: return true;
    default: return false;
  }
}

namespace {

bool is_integral_value(double s) { return std::isfinite(s) && s == std::trunc(s); }

void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
  EMBER_CHECK(a.device() == b.device(), op, ": expected all tensors on one device, got ", a.device(),
              " (shape ", a.shape(), ") and ", b.device(), " (shape ", b.shape(), ")");
}

// True when `t` reads memory of `out` through a different geometry, so that writing `out`
// element by element could change values of `t` not yet read.
bool overlaps_differently(const Tensor& t, const Tensor& out) {
  if (t.impl()->storage != out.impl()->storage) return false;
  return !(t.storage_offset() == out.storage_offset() && t.shape() == out.shape() &&
           t.strides() == out.strides() && t.dtype() == out.dtype());
}

// Writing through an expanded view would store many results into one element.
void check_no_internal_overlap(const Tensor& out, const char* op) {
  for (int64_t d = 0; d < out.dim(); ++d)
    EMBER_CHECK(out.stride(d) != 0 || out.size(d) <= 1, op, ": cannot write into a tensor of shape ", out.shape(),
                " whose elements share memory (an expanded view, stride 0 in dim ", d, "); clone() it first");
}

// Result dtype `from` may be stored into `to` unless that turns float into integer or bool.
void check_castable(DType from, DType to, const char* op) {
  EMBER_CHECK(!(is_floating(from) && !is_floating(to)) && !(from != DType::boolean && to == DType::boolean),
              op, ": result type ", dtype_name(from), " can't be cast to the output dtype ", dtype_name(to));
}

DType checked_result(BinaryOp op, DType t) {
  if (op == BinaryOp::Div || op == BinaryOp::Pow) return is_floating(t) ? t : DType::f32;
  EMBER_CHECK(!(op == BinaryOp::Sub && t == DType::boolean),
              "sub: subtracting bool tensors is not supported; use ne() for exclusive or");
  return t;
}

// The result computed into `target` lands in the caller's `out`: through a copy when its dtype
// differs (copy_ counts the write), else it is out's own in-place write.
void write_back(const Tensor& out, const Tensor& target) {
  if (target.is_same(out)) {
    out.bump_version();
  } else {
    copy_(out, target);
  }
}

}  // namespace

DType binary_result_type(BinaryOp op, DType a, DType b) { return checked_result(op, promote_types(a, b)); }

DType binary_result_type(BinaryOp op, DType a, double s) {
  DType t = a;
  if (!is_floating(a)) {
    if (!is_integral_value(s)) t = DType::f32;
    else if (a == DType::boolean && op != BinaryOp::Maximum && op != BinaryOp::Minimum) t = DType::i64;
  }
  return checked_result(op, t);
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b, double alpha, const Tensor& out) {
  const char* name = op_name(op);
  check_same_device(a, b, name);
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  const DType ct = binary_result_type(op, a.dtype(), b.dtype());
  if ((op == BinaryOp::Add || op == BinaryOp::Sub) && !is_floating(ct)) {
    EMBER_CHECK(is_integral_value(alpha), name, ": alpha must be an integer for ", dtype_name(ct),
                " tensors, got ", alpha);
  }
  if (out.defined()) {
    EMBER_CHECK(out.shape() == shape, name, ": output of shape ", out.shape(),
                " does not match the broadcast shape ", shape, " of ", a.shape(), " and ", b.shape());
    check_same_device(out, a, name);
    check_castable(ct, out.dtype(), name);
    check_no_internal_overlap(out, name);
  }
  Tensor target = out.defined() && out.dtype() == ct ? out : make_tensor(shape, ct, a.device());
  if (target.numel() == 0) return out.defined() ? out : target;
  Tensor ac = to_dtype(a, ct), bc = to_dtype(b, ct);
  if (out.defined()) {
    if (overlaps_differently(ac, target)) ac = clone(ac);
    if (overlaps_differently(bc, target)) bc = clone(bc);
  }
  binary_stub.call(a.device(), name)(op, target, ac, bc, alpha);
  if (out.defined()) write_back(out, target);
  return out.defined() ? out : target;
}

Tensor binary(BinaryOp op, const Tensor& a, double s, const Tensor& out) {
  const char* name = op_name(op);
  const DType ct = binary_result_type(op, a.dtype(), s);
  if (out.defined()) {
    EMBER_CHECK(out.shape() == a.shape(), name, ": output of shape ", out.shape(),
                " does not match the input shape ", a.shape());
    check_same_device(out, a, name);
    check_castable(ct, out.dtype(), name);
    check_no_internal_overlap(out, name);
  }
  Tensor target = out.defined() && out.dtype() == ct ? out : make_tensor(a.shape(), ct, a.device());
  if (target.numel() == 0) return out.defined() ? out : target;
  Tensor ac = to_dtype(a, ct);
  if (out.defined() && overlaps_differently(ac, target)) ac = clone(ac);
  binary_scalar_stub.call(a.device(), name)(op, target, ac, s);
  if (out.defined()) write_back(out, target);
  return out.defined() ? out : target;
}

Tensor compare(CompareOp op, const Tensor& a, const Tensor& b) {
  const char* name = op_name(op);
  check_same_device(a, b, name);
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  Tensor out = make_tensor(shape, DType::boolean, a.device());
  if (out.numel() == 0) return out;
  const DType ct = promote_types(a.dtype(), b.dtype());
  compare_stub.call(a.device(), name)(op, out, to_dtype(a, ct), to_dtype(b, ct));
  return out;
}

Tensor compare(CompareOp op, const Tensor& a, double s) {
  const char* name = op_name(op);
  Tensor out = make_tensor(a.shape(), DType::boolean, a.device());
  if (out.numel() == 0) return out;
  compare_scalar_stub.call(a.device(), name)(op, out, a, s);
  return out;
}

Tensor unary(UnaryOp op, const Tensor& x, UnaryParams p) {
  const char* name = op_name(op);
  const bool int_ok = op == UnaryOp::Neg || op == UnaryOp::Abs || op == UnaryOp::Relu || op == UnaryOp::Clamp;
  DType dt = x.dtype();
  // as in PyTorch: a slope times an integer has no integer result worth defining
  EMBER_CHECK(op != UnaryOp::LeakyRelu || is_floating(dt), name, ": expected a floating-point tensor, got ",
              dtype_name(dt), " of shape ", x.shape());
  if (dt == DType::boolean) {
    EMBER_CHECK(!int_ok, name, ": not supported for bool tensors (shape ", x.shape(), ")");
    dt = DType::f32;
  } else if (!is_floating(dt) && !int_ok) {
    dt = DType::f32;
  }
  Tensor out = make_tensor(x.shape(), dt, x.device());
  if (out.numel() == 0) return out;
  unary_stub.call(x.device(), name)(op, out, to_dtype(x, dt), p);
  return out;
}

Tensor unary_backward(UnaryOp op, const Tensor& grad_out, const Tensor& saved, UnaryParams p) {
  const char* name = op_name(op);
  EMBER_CHECK(grad_out.shape() == saved.shape(), name, " backward: gradient of shape ", grad_out.shape(),
              " does not match the saved tensor of shape ", saved.shape());
  EMBER_CHECK(is_floating(saved.dtype()), name, " backward: expected a floating-point tensor, got ",
              dtype_name(saved.dtype()));
  check_same_device(grad_out, saved, name);
  Tensor grad_in = make_tensor(saved.shape(), saved.dtype(), saved.device());
  if (grad_in.numel() == 0) return grad_in;
  unary_backward_stub.call(saved.device(), name)(op, grad_in, to_dtype(grad_out, saved.dtype()), saved, p);
  return grad_in;
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  EMBER_CHECK(cond.dtype() == DType::boolean, "where: condition must be a bool tensor, got ",
              dtype_name(cond.dtype()), " of shape ", cond.shape());
  check_same_device(cond, a, "where");
  check_same_device(a, b, "where");
  const Shape ab = broadcast_shapes(a.shape(), b.shape(), "where");
  const Shape shape = broadcast_shapes(cond.shape(), ab, "where");
  const DType ct = promote_types(a.dtype(), b.dtype());
  Tensor out = make_tensor(shape, ct, a.device());
  if (out.numel() == 0) return out;
  where_stub.call(a.device(), "where")(out, cond, to_dtype(a, ct), to_dtype(b, ct));
  return out;
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  EMBER_CHECK(mask.dtype() == DType::boolean, "masked_fill: mask must be a bool tensor, got ",
              dtype_name(mask.dtype()), " of shape ", mask.shape());
  check_same_device(x, mask, "masked_fill");
  const Shape shape = broadcast_shapes(x.shape(), mask.shape(), "masked_fill");
  EMBER_CHECK(shape == x.shape(), "masked_fill: mask of shape ", mask.shape(),
              " cannot be broadcast to the input's shape ", x.shape());
  EMBER_CHECK(is_floating(x.dtype()) || x.dtype() == DType::boolean || std::isfinite(value),
              "masked_fill: value ", value, " cannot be stored in a ", dtype_name(x.dtype()), " tensor");
  Tensor out = make_tensor(x.shape(), x.dtype(), x.device());
  if (out.numel() == 0) return out;
  masked_fill_stub.call(x.device(), "masked_fill")(out, x, mask, value);
  return out;
}

}  // namespace ember::native
