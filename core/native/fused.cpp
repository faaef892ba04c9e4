#include "core/native/fused.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "core/factory.h"
#include "core/native/copy.h"
#include "core/native/views.h"

namespace ember::native {

EMBER_DEFINE_STUB(bias_gelu_stub);
EMBER_DEFINE_STUB(bias_gelu_backward_stub);
EMBER_DEFINE_STUB(add_layer_norm_stub);
EMBER_DEFINE_STUB(add_layer_norm_backward_stub);
EMBER_DEFINE_STUB(scaled_masked_softmax_stub);
EMBER_DEFINE_STUB(scaled_masked_softmax_backward_stub);
EMBER_DEFINE_STUB(attention_stub);
EMBER_DEFINE_STUB(attention_backward_stub);
EMBER_DEFINE_STUB(attention_library_stub);
EMBER_DEFINE_STUB(attention_library_backward_stub);
EMBER_DEFINE_STUB(attention_library_takes_stub);

DType fused_compute_dtype(DType dt) { return dt == DType::f64 ? DType::f64 : DType::f32; }

bool fused_attention_on(Device d, int64_t head_dim) {
  if (d.is_cpu()) return true;
  static const bool fused_on_gpu = [] {
    const char* v = std::getenv("EMBER_CUDA_ATTENTION");
    return v != nullptr && std::string(v) == "fused";
  }();
  return fused_on_gpu && head_dim <= 256;
}

bool attention_library_takes(Device d, DType dt, int64_t dim_qk, int64_t dim_v, bool masked, double dropout_p) {
  const auto takes = d.is_cpu() ? attention_library_takes_stub.cpu : attention_library_takes_stub.cuda;
  return takes != nullptr && takes(dt, dim_qk, dim_v, masked, dropout_p);
}

FusedDropout make_fused_dropout(double p, int64_t numel, const char* op, Generator& gen) {
  EMBER_CHECK(p >= 0.0 && p < 1.0, op, ": dropout probability must be in [0, 1), got ", p);
  FusedDropout d;
  if (p == 0.0 || numel == 0) return d;
  d.p = p;
  d.scale = 1.0 / (1.0 - p);
  d.state = gen.reserve(uint64_t(numel));  // as native::dropout: one counter per element reserved
  return d;
}

namespace {

void check_floating(const char* op, const char* what, const Tensor& t) {
  EMBER_CHECK(t.defined(), op, ": ", what, " is undefined");
  EMBER_CHECK(is_floating(t.dtype()), op, ": ", what, " must be floating point, got ", dtype_name(t.dtype()),
              " of shape ", t.shape());
}

void check_same_device(const char* op, const char* what, const Tensor& t, const Tensor& x) {
  EMBER_CHECK(t.device() == x.device(), op, ": ", what, " is on ", t.device(), " but the input is on ", x.device());
}

// A [cols] parameter checked against `shape` and returned contiguous in `dtype` (or undefined).
Tensor row_param(const char* op, const char* what, const Tensor& p, const Shape& shape, const Tensor& x, DType dtype) {
  if (!p.defined()) return p;
  check_floating(op, what, p);
  check_same_device(op, what, p, x);
  EMBER_CHECK(p.shape() == shape, op, ": ", what, " of shape ", p.shape(), " does not match ", shape,
              " (input of shape ", x.shape(), ")");
  return contiguous(reshape(to_dtype(p, dtype), {numel_of(shape)}));
}

// x contiguous in `dtype` when it is f64 compute, else in its own (float-lane) dtype.
Tensor lane_input(const Tensor& x, DType compute) {
  return contiguous(compute == DType::f64 ? to_dtype(x, DType::f64) : x);
}

}  // namespace

// ---- bias + GELU

Tensor bias_gelu(const Tensor& x, const Tensor& bias, bool tanh_approx) {
  constexpr const char* op = "bias_gelu";
  check_floating(op, "input", x);
  EMBER_CHECK(x.dim() >= 1, op, ": input must have at least one dim, got shape ", x.shape());
  const int64_t cols = x.shape().back();
  const DType cd = fused_compute_dtype(x.dtype());
  const Tensor b = row_param(op, "bias", bias, {cols}, x, cd);
  EMBER_CHECK(b.defined(), op, ": bias is undefined (input of shape ", x.shape(), ")");
  Tensor y = make_tensor(x.shape(), x.dtype(), x.device());
  if (y.numel() == 0) return y;
  bias_gelu_stub.call(x.device(), op)(y, contiguous(x), b, tanh_approx);
  return y;
}

BiasGeluGrads bias_gelu_backward(const Tensor& grad, const Tensor& x, const Tensor& bias, bool tanh_approx,
                                 bool need_dx, bool need_dbias) {
  constexpr const char* op = "bias_gelu_backward";
  EMBER_CHECK(grad.shape() == x.shape(), op, ": gradient of shape ", grad.shape(),
              " does not match the input of shape ", x.shape());
  const int64_t cols = x.shape().back();
  const DType cd = fused_compute_dtype(x.dtype());
  const Tensor b = row_param(op, "bias", bias, {cols}, x, cd);
  BiasGeluGrads out;
  if (need_dx) out.dx = make_tensor(x.shape(), x.dtype(), x.device());
  if (need_dbias) out.dbias = make_tensor({cols}, cd, x.device());
  if (x.numel() == 0) {
    if (out.dbias.defined()) fill_(out.dbias, 0.0);
    return out;
  }
  if (out.dx.defined() || out.dbias.defined()) {
    bias_gelu_backward_stub.call(x.device(), op)(out.dx, out.dbias, contiguous(to_dtype(grad, x.dtype())),
                                                 contiguous(x), b, tanh_approx);
  }
  return out;
}

// ---- residual add + layer norm

AddLayerNormResult add_layer_norm(const Tensor& x, const Tensor& residual, const Shape& normalized_shape,
                                  const Tensor& weight, const Tensor& bias, const Tensor& x_bias, double eps,
                                  double dropout_p, DType out_dtype, Generator& gen) {
  constexpr const char* op = "add_layer_norm";
  check_floating(op, "input", x);
  check_floating(op, "residual", residual);
  check_same_device(op, "residual", residual, x);
  EMBER_CHECK(is_floating(out_dtype), op, ": output dtype must be floating point, got ", dtype_name(out_dtype));
  EMBER_CHECK(residual.shape() == x.shape(), op, ": residual of shape ", residual.shape(),
              " does not match the input of shape ", x.shape());
  EMBER_CHECK(eps >= 0, op, ": eps must be non-negative, got ", eps);
  const int64_t k = int64_t(normalized_shape.size());
  bool matches = k >= 1 && x.dim() >= k;
  for (int64_t i = 0; matches && i < k; ++i)
    matches = x.shape()[size_t(x.dim() - k + i)] == normalized_shape[size_t(i)];
  EMBER_CHECK(matches, op, ": normalized_shape ", normalized_shape,
              " does not match the trailing dims of the input of shape ", x.shape());
  const int64_t cols = numel_of(normalized_shape);
  const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  const bool f64 = x.dtype() == DType::f64 || residual.dtype() == DType::f64 || out_dtype == DType::f64;
  const DType cd = f64 ? DType::f64 : DType::f32;
  const Tensor w = row_param(op, "weight", weight, normalized_shape, x, cd);
  const Tensor b = row_param(op, "bias", bias, normalized_shape, x, cd);
  const Tensor xb = row_param(op, "x_bias", x_bias, normalized_shape, x, cd);

  AddLayerNormResult r;
  AddLayerNormSaved& s = r.saved;
  r.y = make_tensor(x.shape(), f64 ? DType::f64 : out_dtype, x.device());
  s.h = make_tensor({rows, cols}, cd, x.device());
  s.mean = make_tensor({rows}, cd, x.device());
  s.rstd = make_tensor({rows}, cd, x.device());
  s.shape = x.shape();
  s.y_dtype = out_dtype;
  const FusedDropout d = make_fused_dropout(dropout_p, x.numel(), op, gen);
  if (d.active()) s.keep = make_tensor({rows, cols}, DType::boolean, x.device());
  if (x.numel() == 0) return r;
  add_layer_norm_stub.call(x.device(), op)(r.y, s.h, s.mean, s.rstd, s.keep, lane_input(x, cd),
                                           lane_input(residual, cd), xb, w, b, eps, d);
  r.y = to_dtype(r.y, out_dtype);
  return r;
}

AddLayerNormGrads add_layer_norm_backward(const Tensor& grad, const AddLayerNormSaved& saved, const Tensor& weight,
                                          DType x_dtype, DType residual_dtype, double dropout_scale, bool need_dx,
                                          bool need_dresidual, bool need_dx_bias, bool need_dweight, bool need_dbias,
                                          bool share) {
  constexpr const char* op = "add_layer_norm_backward";
  EMBER_CHECK(grad.shape() == saved.shape, op, ": gradient of shape ", grad.shape(),
              " does not match the output of shape ", saved.shape);
  const Tensor& h = saved.h;
  const int64_t rows = h.shape()[0], cols = h.shape()[1];
  const DType cd = h.dtype();
  const Shape& shape = saved.shape;
  const Device dev = h.device();
  const Tensor w = weight.defined() ? contiguous(reshape(to_dtype(weight, cd), {cols})) : Tensor();
  // dx equals dresidual without dropout: one tensor serves both when the dtypes agree.
  const bool shared = share && need_dx && need_dresidual && !saved.keep.defined() && x_dtype == residual_dtype;
  AddLayerNormGrads out;
  Tensor dx, dres;
  // f64 compute writes f64 gradients, converted to the inputs' dtypes at the end
  const DType dx_dtype = cd == DType::f64 ? cd : x_dtype, dres_dtype = cd == DType::f64 ? cd : residual_dtype;
  if (need_dresidual || shared) dres = make_tensor({rows, cols}, dres_dtype, dev);
  if (need_dx && !shared) dx = make_tensor({rows, cols}, dx_dtype, dev);
  // the x_bias gradient needs dx's values even when dx itself is not wanted
  Tensor dxb = need_dx_bias ? make_tensor({cols}, cd, dev) : Tensor();
  Tensor dw = need_dweight ? make_tensor({cols}, cd, dev) : Tensor();
  Tensor db = need_dbias ? make_tensor({cols}, cd, dev) : Tensor();
  const DType grad_dtype = cd == DType::f64 ? cd : saved.y_dtype;
  if (rows == 0 || cols == 0) {
    for (Tensor* t : {&dxb, &dw, &db})
      if (t->defined()) fill_(*t, 0.0);
  } else if (dx.defined() || dres.defined() || dxb.defined() || dw.defined() || db.defined()) {
    add_layer_norm_backward_stub.call(dev, op)(dx, dres, dxb, dw, db,
                                               contiguous(reshape(to_dtype(grad, grad_dtype), {rows, cols})), h,
                                               saved.mean, saved.rstd, w, saved.keep, dropout_scale);
  }
  if (shared) dx = dres;
  if (dx.defined()) out.dx = to_dtype(view(dx, shape), x_dtype);
  if (dres.defined() && need_dresidual) out.dresidual = shared ? out.dx : to_dtype(view(dres, shape), residual_dtype);
  out.dx_bias = dxb;
  out.dweight = dw;
  out.dbias = db;
  return out;
}

// ---- scale + additive mask + softmax

ScaledMaskedSoftmaxResult scaled_masked_softmax(const Tensor& x, const Tensor& mask, double scale, double dropout_p,
                                                DType out_dtype, Generator& gen) {
  constexpr const char* op = "scaled_masked_softmax";
  check_floating(op, "input", x);
  EMBER_CHECK(x.dim() >= 1, op, ": input must have at least one dim, got shape ", x.shape());
  EMBER_CHECK(is_floating(out_dtype), op, ": output dtype must be floating point, got ", dtype_name(out_dtype));
  const bool f64 = x.dtype() == DType::f64 || out_dtype == DType::f64 || (mask.defined() && mask.dtype() == DType::f64);
  const DType cd = f64 ? DType::f64 : DType::f32;
  ScaledMaskedSoftmaxResult r;
  ScaledMaskedSoftmaxSaved& s = r.saved;
  s.x = lane_input(x, cd);
  s.y_dtype = out_dtype;
  if (mask.defined()) {
    check_floating(op, "mask", mask);
    check_same_device(op, "mask", mask, x);
    const Shape b = broadcast_shapes(mask.shape(), x.shape(), op);
    EMBER_CHECK(b == x.shape(), op, ": mask of shape ", mask.shape(), " does not broadcast to the input of shape ",
                x.shape());
    s.mask = expand(f64 ? to_dtype(mask, DType::f64) : mask, x.shape());
  }
  const int64_t len = x.shape().back();
  const int64_t rows = len == 0 ? 0 : x.numel() / len;
  r.y = make_tensor(x.shape(), f64 ? DType::f64 : out_dtype, x.device());
  s.stats = make_tensor({rows, 2}, cd, x.device());
  const FusedDropout d = make_fused_dropout(dropout_p, x.numel(), op, gen);
  if (d.active()) s.keep = make_tensor(x.shape(), DType::boolean, x.device());
  if (x.numel() == 0) return r;
  scaled_masked_softmax_stub.call(x.device(), op)(r.y, s.stats, s.keep, s.x, s.mask, scale, d);
  r.y = to_dtype(r.y, out_dtype);
  return r;
}

Tensor scaled_masked_softmax_backward(const Tensor& grad, const ScaledMaskedSoftmaxSaved& saved, double scale,
                                      double out_scale, double dropout_scale) {
  constexpr const char* op = "scaled_masked_softmax_backward";
  EMBER_CHECK(grad.shape() == saved.x.shape(), op, ": gradient of shape ", grad.shape(),
              " does not match the output of shape ", saved.x.shape());
  Tensor dx = make_tensor(saved.x.shape(), saved.x.dtype(), saved.x.device());
  if (dx.numel() == 0) return dx;
  const DType grad_dtype = saved.stats.dtype() == DType::f64 ? DType::f64 : saved.y_dtype;
  scaled_masked_softmax_backward_stub.call(dx.device(), op)(dx, contiguous(to_dtype(grad, grad_dtype)), saved.x,
                                                            saved.mask, saved.stats, saved.keep, scale, out_scale,
                                                            dropout_scale);
  return dx;
}

// ---- attention

namespace {

// The pair layout of a [B, L, 3E]-shaped tensor's columns c0 .. c0 + D - 1 of head h (the
// packed projection's thirds, and ctx [B, L, E] with c0 = 0).
AttentionOperand packed_operand(const Tensor& t, int64_t c0, int64_t width, int64_t head_dim) {
  const int64_t ld = t.size(2);
  return {slice(t, 2, c0, c0 + width, 1), t.size(1) * ld, head_dim, ld};
}

AttentionProblem packed_problem(const Tensor& qkv, int64_t heads, const Tensor& mask, double scale) {
  const int64_t e = qkv.size(2) / 3, d = e / heads;
  AttentionProblem a;
  a.q = packed_operand(qkv, 0, e, d);
  a.k = packed_operand(qkv, e, e, d);
  a.v = packed_operand(qkv, 2 * e, e, d);
  a.mask = mask;
  a.outer = qkv.size(0);
  a.inner = heads;
  a.len_q = a.len_k = qkv.size(1);
  a.dim_qk = a.dim_v = d;
  a.scale = scale;
  return a;
}

// x broadcast to batch + [rows, cols], seen as [outer, inner, rows, cols] (a view where the
// strides allow, else a copy) with contiguous columns and rows no closer than a row's width.
Tensor as_pairs(const Tensor& x, const Shape& batch, int64_t outer, int64_t inner, int64_t rows, int64_t cols) {
  Shape full = batch;
  full.push_back(rows);
  full.push_back(cols);
  Tensor t = reshape(expand(x, full), {outer, inner, rows, cols});
  const bool cols_ok = cols <= 1 || t.strides()[3] == 1;
  const bool rows_ok = rows <= 1 || t.strides()[2] >= cols;
  return cols_ok && rows_ok ? t : contiguous(t);
}

AttentionOperand pair_operand(const Tensor& t4) {
  return {t4, t4.strides()[0], t4.strides()[1], t4.strides()[2]};
}

Shape leading(const Tensor& t) { return Shape(t.shape().begin(), t.shape().end() - 2); }

// The library's passes where a kernel is registered for the device and it accepts the problem.
bool library_forward(const AttentionProblem& a, const AttentionOperand& out, const Tensor& stats,
                     const FusedDropout& d) {
  const Device dev = a.q.data.device();
  const auto run = dev.is_cpu() ? attention_library_stub.cpu : attention_library_stub.cuda;
  return run != nullptr && run(a, out, stats, d);
}

bool library_backward(const AttentionProblem& a, const AttentionOperand& grad, const AttentionOperand& dq,
                      const AttentionOperand& dk, const AttentionOperand& dv, const Tensor& stats, const Tensor& keep,
                      double dropout_scale) {
  const Device dev = a.q.data.device();
  const auto run = dev.is_cpu() ? attention_library_backward_stub.cpu : attention_library_backward_stub.cuda;
  return run != nullptr && run(a, grad, dq, dk, dv, stats, keep, dropout_scale);
}

// An f16 problem as Ember's kernels take it (they have no f16): q, k and v copied to f32, each
// [outer, inner, rows, cols] as scaled_dot_product_attention lays them out.
AttentionProblem widened(const AttentionProblem& a) {
  AttentionProblem w = a;
  for (AttentionOperand* o : {&w.q, &w.k, &w.v}) *o = pair_operand(contiguous(to_dtype(o->data, DType::f32)));
  return w;
}

}  // namespace

PackedAttentionResult packed_self_attention(const Tensor& qkv, int64_t heads, const Tensor& mask, double scale,
                                            double dropout_p, Generator& gen) {
  constexpr const char* op = "packed_self_attention";
  check_floating(op, "qkv", qkv);
  EMBER_CHECK(qkv.dim() == 3, op, ": qkv must be [batch, length, 3 * embed_dim], got shape ", qkv.shape());
  EMBER_CHECK(heads > 0 && qkv.size(2) % (3 * heads) == 0, op, ": qkv of shape ", qkv.shape(),
              " does not split into q, k and v of ", heads, " heads each (last dim must be a multiple of ", 3 * heads,
              ")");
  EMBER_CHECK(qkv.dtype() == DType::f32 || qkv.dtype() == DType::bf16 || qkv.dtype() == DType::f64, op,
              ": qkv must be f32, bf16 or f64, got ", dtype_name(qkv.dtype()));
  const int64_t b = qkv.size(0), len = qkv.size(1), e = qkv.size(2) / 3;
  const Shape scores{b, heads, len, len};
  PackedAttentionResult r;
  PackedAttentionSaved& s = r.saved;
  s.qkv = contiguous(qkv);
  s.heads = heads;
  s.scale = scale;
  if (mask.defined()) {
    check_floating(op, "mask", mask);
    check_same_device(op, "mask", mask, qkv);
    const Shape bs = broadcast_shapes(mask.shape(), scores, op);
    EMBER_CHECK(bs == scores, op, ": mask of shape ", mask.shape(), " does not broadcast to the scores of shape ",
                scores, " (qkv of shape ", qkv.shape(), ")");
    // the kernels read f32, bf16 or f16 masks in float and f64 ones only in double
    const bool narrow_mask = mask.dtype() == DType::f64 && qkv.dtype() != DType::f64;
    s.mask = expand(narrow_mask ? to_dtype(mask, DType::f32) : mask, scores);
  }
  const DType cd = fused_compute_dtype(qkv.dtype());
  r.ctx = make_tensor({b, len, e}, qkv.dtype(), qkv.device());
  s.stats = make_tensor({b * heads * len, 2}, cd, qkv.device());
  const FusedDropout d = make_fused_dropout(dropout_p, numel_of(scores), op, gen);
  if (d.active()) s.keep = make_tensor(scores, DType::boolean, qkv.device());
  if (r.ctx.numel() == 0) return r;
  const AttentionProblem a = packed_problem(s.qkv, heads, s.mask, scale);
  const AttentionOperand ctx = packed_operand(r.ctx, 0, e, a.dim_v);
  if (!library_forward(a, ctx, s.stats, d)) attention_stub.call(qkv.device(), op)(a, ctx, s.stats, s.keep, d);
  return r;
}

Tensor packed_self_attention_backward(const Tensor& grad, const PackedAttentionSaved& saved, double dropout_scale) {
  constexpr const char* op = "packed_self_attention_backward";
  const Tensor& qkv = saved.qkv;
  const int64_t e = qkv.size(2) / 3;
  const Shape out{qkv.size(0), qkv.size(1), e};
  EMBER_CHECK(grad.shape() == out, op, ": gradient of shape ", grad.shape(), " does not match the output of shape ",
              out);
  Tensor dqkv = make_tensor(qkv.shape(), qkv.dtype(), qkv.device());
  if (dqkv.numel() == 0) return dqkv;
  const AttentionProblem a = packed_problem(qkv, saved.heads, saved.mask, saved.scale);
  const int64_t d = a.dim_qk;
  const AttentionOperand g = packed_operand(contiguous(to_dtype(grad, qkv.dtype())), 0, e, d);
  const AttentionOperand dq = packed_operand(dqkv, 0, e, d), dk = packed_operand(dqkv, e, e, d),
                         dv = packed_operand(dqkv, 2 * e, e, d);
  if (!library_backward(a, g, dq, dk, dv, saved.stats, saved.keep, dropout_scale))
    attention_backward_stub.call(qkv.device(), op)(a, g, dq, dk, dv, saved.stats, saved.keep, dropout_scale);
  return dqkv;
}

AttentionResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                             bool causal, double scale, double dropout_p, Generator& gen) {
  constexpr const char* op = "scaled_dot_product_attention";
  check_floating(op, "query", q);
  check_floating(op, "key", k);
  check_floating(op, "value", v);
  EMBER_CHECK(q.dim() >= 2 && k.dim() >= 2 && v.dim() >= 2, op,
              ": query, key and value need at least 2 dims, got shapes ", q.shape(), ", ", k.shape(), " and ",
              v.shape());
  EMBER_CHECK(q.size(-1) == k.size(-1) && k.size(-2) == v.size(-2), op, ": query ", q.shape(), ", key ", k.shape(),
              " and value ", v.shape(), " do not fit: query and key need one last dim, key and value one length");
  EMBER_CHECK(q.dtype() == k.dtype() && k.dtype() == v.dtype(), op, ": query, key and value must share a dtype, got ",
              dtype_name(q.dtype()), ", ", dtype_name(k.dtype()), " and ", dtype_name(v.dtype()));
  EMBER_CHECK(q.dtype() == DType::f32 || q.dtype() == DType::bf16 || q.dtype() == DType::f16 || q.dtype() == DType::f64,
              op, ": query, key and value must be f32, bf16, f16 or f64, got ", dtype_name(q.dtype()));
  check_same_device(op, "key", k, q);
  check_same_device(op, "value", v, q);
  EMBER_CHECK(!(causal && mask.defined()), op, ": give either a mask or is_causal, not both (query of shape ",
              q.shape(), ")");
  AttentionResult r;
  AttentionSaved& s = r.saved;
  AttentionProblem& a = s.problem;
  s.batch = broadcast_shapes(broadcast_shapes(leading(q), leading(k), op), leading(v), op);
  a.len_q = q.size(-2);
  a.len_k = k.size(-2);
  a.dim_qk = q.size(-1);
  a.dim_v = v.size(-1);
  a.inner = s.batch.empty() ? 1 : s.batch.back();
  a.outer = s.batch.empty() ? 1 : numel_of(s.batch) / std::max<int64_t>(a.inner, 1);
  if (a.inner == 0) a.outer = 0;
  a.causal = causal;
  a.scale = scale;
  a.q = pair_operand(as_pairs(q, s.batch, a.outer, a.inner, a.len_q, a.dim_qk));
  a.k = pair_operand(as_pairs(k, s.batch, a.outer, a.inner, a.len_k, a.dim_qk));
  a.v = pair_operand(as_pairs(v, s.batch, a.outer, a.inner, a.len_k, a.dim_v));
  Shape scores = s.batch;
  scores.push_back(a.len_q);
  scores.push_back(a.len_k);
  if (mask.defined()) {
    check_floating(op, "mask", mask);
    check_same_device(op, "mask", mask, q);
    EMBER_CHECK(broadcast_shapes(mask.shape(), scores, op) == scores, op, ": mask of shape ", mask.shape(),
                " does not broadcast to the scores of shape ", scores, " (query ", q.shape(), ", key ", k.shape(), ")");
    const bool narrow_mask = mask.dtype() == DType::f64 && q.dtype() != DType::f64;
    a.mask = as_pairs(narrow_mask ? to_dtype(mask, DType::f32) : mask, s.batch, a.outer, a.inner, a.len_q, a.len_k);
  }
  Shape out_shape = s.batch;
  out_shape.push_back(a.len_q);
  out_shape.push_back(a.dim_v);
  r.out = make_tensor(out_shape, q.dtype(), q.device());
  s.stats = make_tensor({a.pairs() * a.len_q, 2}, fused_compute_dtype(q.dtype()), q.device());
  const FusedDropout d = make_fused_dropout(dropout_p, numel_of(scores), op, gen);
  if (d.active()) s.keep = make_tensor(scores, DType::boolean, q.device());
  if (r.out.numel() == 0) return r;
  if (a.len_k == 0) {  // softmax over no keys weighs nothing: the product is zero, as torch's
    fill_(r.out, 0.0);
    return r;
  }
  const Tensor out4 = view(r.out, {a.outer, a.inner, a.len_q, a.dim_v});
  if (library_forward(a, pair_operand(out4), s.stats, d)) return r;
  if (q.dtype() == DType::f16) {
    const Tensor out32 = make_tensor(out4.shape(), DType::f32, q.device());
    attention_stub.call(q.device(), op)(widened(a), pair_operand(out32), s.stats, s.keep, d);
    copy_(out4, out32);
    return r;
  }
  attention_stub.call(q.device(), op)(a, pair_operand(out4), s.stats, s.keep, d);
  return r;
}

AttentionGrads scaled_dot_product_attention_backward(const Tensor& grad, const AttentionSaved& saved,
                                                     double dropout_scale) {
  constexpr const char* op = "scaled_dot_product_attention_backward";
  const AttentionProblem& a = saved.problem;
  const DType dt = a.q.data.dtype();
  const Device dev = a.q.data.device();
  Shape out_shape = saved.batch;
  out_shape.push_back(a.len_q);
  out_shape.push_back(a.dim_v);
  EMBER_CHECK(grad.shape() == out_shape, op, ": gradient of shape ", grad.shape(),
              " does not match the output of shape ", out_shape);
  auto grad_of = [&](int64_t rows, int64_t cols) {
    Shape s = saved.batch;
    s.push_back(rows);
    s.push_back(cols);
    return make_tensor(s, dt, dev);
  };
  AttentionGrads g{grad_of(a.len_q, a.dim_qk), grad_of(a.len_k, a.dim_qk), grad_of(a.len_k, a.dim_v)};
  if (a.pairs() == 0) return g;
  if (a.len_q == 0 || a.len_k == 0 || a.dim_v == 0) {
    for (Tensor* t : {&g.dq, &g.dk, &g.dv}) fill_(*t, 0.0);
    return g;
  }
  auto pairs_of = [&](const Tensor& t) { return pair_operand(view(t, {a.outer, a.inner, t.size(-2), t.size(-1)})); };
  const AttentionOperand go = pairs_of(contiguous(to_dtype(grad, dt)));
  if (library_backward(a, go, pairs_of(g.dq), pairs_of(g.dk), pairs_of(g.dv), saved.stats, saved.keep, dropout_scale))
    return g;
  if (dt == DType::f16) {  // Ember's kernels on f32 copies, the gradients rounded back
    const AttentionGrads w{make_tensor(g.dq.shape(), DType::f32, dev), make_tensor(g.dk.shape(), DType::f32, dev),
                           make_tensor(g.dv.shape(), DType::f32, dev)};
    attention_backward_stub.call(dev, op)(widened(a), pairs_of(contiguous(to_dtype(grad, DType::f32))),
                                          pairs_of(w.dq), pairs_of(w.dk), pairs_of(w.dv), saved.stats, saved.keep,
                                          dropout_scale);
    copy_(g.dq, w.dq);
    copy_(g.dk, w.dk);
    copy_(g.dv, w.dv);
    return g;
  }
  attention_backward_stub.call(dev, op)(a, go, pairs_of(g.dq), pairs_of(g.dk), pairs_of(g.dv), saved.stats, saved.keep,
                                        dropout_scale);
  return g;
}

}  // namespace ember::native
