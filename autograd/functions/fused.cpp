// Differentiable fused ops (core/ops.h, "fused"): forward through core/native/fused.h, backward
// through its fused backward kernels, with the autocast policy of the ops they replace. Off the
// CPU they run the composition they stand for. Each can be differentiated twice: under
// create_graph the kernels' gradients carry the history of the same gradients composed from
// differentiable ops (fused_gradients.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "autograd/functions/composed_gradient.h"
#include "autograd/functions/elementwise_gradients.h"
#include "autograd/functions/fused_gradients.h"
#include "autograd/node.h"
#include "core/autocast.h"
#include "core/factory.h"
#include "core/native/copy.h"
#include "core/native/fused.h"
#include "core/native/views.h"
#include "core/ops.h"

namespace ember {
using autograd::sum_to_shape;
using autograd::Tensors;

namespace {

Tensor in_dtype(const Tensor& t, DType dtype) { return t.defined() ? native::to_dtype(t, dtype) : t; }

// t in dtype, differentiably (a composed gradient's cast).
Tensor as_dtype(const Tensor& t, DType dtype) { return t.defined() && t.dtype() != dtype ? t.to(dtype) : t; }

// The dtype layer_norm and softmax compute in under autocast: half types widen to f32.
DType autocast_f32(const Tensor& t) {
  return autocast::active_for(t) && (t.dtype() == DType::f16 || t.dtype() == DType::bf16) ? DType::f32 : t.dtype();
}

bool wants(const Tensor& t) { return t.defined() && t.requires_grad(); }

}  // namespace

Tensor bias_gelu(const Tensor& x_in, const Tensor& bias_in, bool tanh_approx) {
  EMBER_CHECK(x_in.defined() && bias_in.defined(), "bias_gelu: input and bias must be defined");
  // Autocast: the bias follows linear's policy, so a lower-precision x keeps its dtype.
  const Tensor bias = autocast::to_lower(bias_in);
  const DType dt = promote_types(x_in.dtype(), bias.dtype());
  const Tensor x = x_in.dtype() == dt ? x_in : x_in.to(dt);
  if (!x.is_cpu()) return gelu(add(x, bias), tanh_approx);
  Tensor y = native::bias_gelu(x, bias, tanh_approx);
  if (autograd::needs_grad({x, bias})) {
    const bool need_dx = wants(x), need_db = wants(bias);
    autograd::record(
        "BiasGeluBackward", {x, bias}, {y},
        [sx = autograd::save_with_history(x), sb = autograd::save_with_history(bias), tanh_approx, need_dx,
         need_db](const Tensors& g) -> Tensors {
          const Tensor xv = sx.unpack(), b = sb.unpack();
          native::BiasGeluGrads d = native::bias_gelu_backward(g[0], xv, b, tanh_approx, need_dx, need_db);
          return autograd::with_composed_history(
              "BiasGeluGradBackward", {d.dx, in_dtype(d.dbias, b.dtype())}, {g[0], xv, b},
              [&] { return autograd::bias_gelu_gradients(g[0], xv, b, tanh_approx); });
        },
        autograd::Backward::differentiable);
  }
  return y;
}

Tensor add_layer_norm(const Tensor& x, const Tensor& residual_in, const Shape& normalized_shape,
                      const Tensor& weight_in, const Tensor& bias_in, double eps, double dropout_p, bool training,
                      const Tensor& x_bias) {
  EMBER_CHECK(x.defined() && residual_in.defined(), "add_layer_norm: input and residual must be defined");
  EMBER_CHECK(dropout_p >= 0.0 && dropout_p <= 1.0, "add_layer_norm: dropout probability must be in [0, 1], got ",
              dropout_p, " (input of shape ", x.shape(), ")");
  const double p = training ? dropout_p : 0.0;
  const Tensor weight = autocast::to_f32(weight_in), bias = autocast::to_f32(bias_in);
  if (!x.is_cpu() || p == 1.0) {
    Tensor h = x_bias.defined() ? add(x, x_bias) : x;
    h = add(dropout(h, p, true), residual_in);
    return layer_norm(h, normalized_shape, weight, bias, eps);
  }
  // A broadcast residual (e.g. position embeddings) is expanded; its gradient sums back.
  const Tensor residual = residual_in.shape() == x.shape()
                              ? residual_in
                              : residual_in.expand(broadcast_shapes(residual_in.shape(), x.shape(), "add_layer_norm"));
  const DType out_dtype = promote_types(autocast_f32(x), autocast_f32(residual));
  native::AddLayerNormResult r =
      native::add_layer_norm(x, residual, normalized_shape, weight, bias, x_bias, eps, p, out_dtype);
  if (autograd::needs_grad({x, residual, weight, bias, x_bias})) {
    const bool need_dx = wants(x), need_dr = wants(residual), need_dw = wants(weight), need_db = wants(bias),
               need_dxb = wants(x_bias);
    const DType x_dt = x.dtype(), r_dt = residual.dtype();
    const DType w_dt = weight.defined() ? weight.dtype() : DType::f32,
                b_dt = bias.defined() ? bias.dtype() : DType::f32,
                xb_dt = x_bias.defined() ? x_bias.dtype() : DType::f32;
    const Shape ns = normalized_shape, xb_shape = x_bias.defined() ? x_bias.shape() : Shape{};
    const double scale = p > 0.0 ? 1.0 / (1.0 - p) : 1.0;
    // One tensor for dx and dresidual, unless a leaf's gradient accumulator would copy it (it
    // copies a tensor another consumer still holds): then two, written in the kernel's one pass.
    const bool share = !x.is_leaf() && !residual.is_leaf();
    // h = dropout(x + x_bias) + residual, the kernel's, with a node to x, residual and x_bias that
    // keeps none of their data: the composed gradient under create_graph goes through it.
    Tensor h = native::reshape(r.saved.h, x.shape());
    if (autograd::needs_grad({x, residual, x_bias})) {
      autograd::record(
          "AddDropoutBackward", {x, residual, x_bias}, {h},
          [keep = r.saved.keep, scale, xb_shape, x_dt, r_dt, xb_dt](const Tensors& g) -> Tensors {
            const Tensors d = autograd::add_dropout_gradients(g[0], keep, scale, xb_shape);
            return {as_dtype(d[0], x_dt), as_dtype(d[1], r_dt), as_dtype(d[2], xb_dt)};
          },
          autograd::Backward::differentiable);
    }
    autograd::record(
        "AddLayerNormBackward", {x, residual, weight, bias, x_bias}, {r.y},
        [saved = r.saved, sh = autograd::save_with_history(h), ws = autograd::save_with_history(weight), need_dx,
         need_dr, need_dw, need_db, need_dxb, share, x_dt, r_dt, w_dt, b_dt, xb_dt, ns, xb_shape, scale,
         eps](const Tensors& g) -> Tensors {
          const Tensor wv = ws.unpack(), hv = sh.unpack();
          native::AddLayerNormGrads d = native::add_layer_norm_backward(g[0], saved, wv, x_dt, r_dt, scale, need_dx,
                                                                        need_dr, need_dxb, need_dw, need_db, share);
          auto shaped = [&](const Tensor& t, DType dt) {
            return t.defined() ? in_dtype(native::reshape(t, ns), dt) : t;
          };
          return autograd::with_composed_history(
              "AddLayerNormGradBackward",
              {d.dx, d.dresidual, shaped(d.dweight, w_dt), shaped(d.dbias, b_dt), shaped(d.dx_bias, xb_dt)},
              {g[0], hv, wv}, [&] {
                return autograd::add_layer_norm_gradients(g[0], hv, saved.keep, scale, xb_shape, ns, wv, eps,
                                                          {need_dx || need_dr || need_dxb, need_dw, need_db});
              });
        },
        autograd::Backward::differentiable);
  }
  return r.y;
}

Tensor scaled_masked_softmax(const Tensor& x, const Tensor& mask, double scale, double dropout_p, bool training,
                             std::optional<DType> dtype) {
  EMBER_CHECK(x.defined(), "scaled_masked_softmax: input is undefined");
  EMBER_CHECK(dropout_p >= 0.0 && dropout_p <= 1.0,
              "scaled_masked_softmax: dropout probability must be in [0, 1], got ", dropout_p, " (input of shape ",
              x.shape(), ")");
  const double p = training ? dropout_p : 0.0;
  if (dtype)
    EMBER_CHECK(is_floating(*dtype), "scaled_masked_softmax: dtype must be floating point, got ", dtype_name(*dtype));
  if (!x.is_cpu() || p == 1.0) {
    Tensor s = mul(x, scale);
    if (mask.defined()) s = add(s, mask);
    Tensor y = dropout(softmax(s, -1), p, true);
    return dtype ? y.to(*dtype) : y;
  }
  const DType out_dtype = dtype            ? *dtype
                          : mask.defined() ? promote_types(autocast_f32(x), autocast_f32(mask))
                                           : autocast_f32(x);
  native::ScaledMaskedSoftmaxResult r = native::scaled_masked_softmax(x, mask, scale, p, out_dtype);
  if (autograd::needs_grad({x, mask})) {
    // x itself when contiguous: saved without history, checked for in-place changes.
    const autograd::SavedTensor sx = autograd::save(r.saved.x), sm = autograd::save(r.saved.mask);
    r.saved.x = Tensor();
    r.saved.mask = Tensor();
    const bool need_dx = wants(x), need_dmask = wants(mask);
    const DType x_dt = x.dtype(), m_dt = mask.defined() ? mask.dtype() : DType::f32;
    const Shape m_shape = mask.defined() ? mask.shape() : Shape{};
    const double drop_scale = p > 0.0 ? 1.0 / (1.0 - p) : 1.0;
    // x and the mask with their history, for the composed gradient (no copies: x is the saved x
    // itself when contiguous, the mask is the caller's).
    autograd::record(
        "ScaledMaskedSoftmaxBackward", {x, mask}, {r.y},
        [stats = r.saved, sx, sm, hx = autograd::save_with_history(x), hm = autograd::save_with_history(mask), scale,
         drop_scale, need_dx, need_dmask, x_dt, m_dt, m_shape](const Tensors& g) -> Tensors {
          native::ScaledMaskedSoftmaxSaved saved = stats;
          saved.x = sx.unpack();
          saved.mask = sm.unpack();
          Tensors grads(2);
          if (!need_dmask) {
            grads[0] = in_dtype(native::scaled_masked_softmax_backward(g[0], saved, scale, scale, drop_scale), x_dt);
          } else {
            // The mask's gradient is that of the masked scores, summed over its broadcast dims.
            const Tensor ds = native::scaled_masked_softmax_backward(g[0], saved, scale, 1.0, drop_scale);
            if (need_dx) grads[0] = in_dtype(mul(ds, scale), x_dt);
            grads[1] = in_dtype(sum_to_shape(ds, m_shape), m_dt);
          }
          const Tensor xv = hx.unpack(), mv = hm.unpack();
          return autograd::with_composed_history("ScaledMaskedSoftmaxGradBackward", grads, {g[0], xv, mv}, [&] {
            return autograd::scaled_masked_softmax_gradients(g[0], xv, mv, saved.keep, scale, drop_scale);
          });
        },
        autograd::Backward::differentiable);
  }
  return r.y;
}

Tensor packed_self_attention(const Tensor& qkv_in, int64_t num_heads, const Tensor& mask, double dropout_p,
                             bool training) {
  constexpr const char* op = "packed_self_attention";
  EMBER_CHECK(qkv_in.defined(), op, ": qkv is undefined");
  EMBER_CHECK(qkv_in.dim() == 3, op, ": qkv must be [batch, length, 3 * embed_dim], got shape ", qkv_in.shape());
  EMBER_CHECK(num_heads > 0 && qkv_in.size(2) % (3 * num_heads) == 0, op, ": qkv of shape ", qkv_in.shape(),
              " does not split into q, k and v of ", num_heads, " heads each (last dim must be a multiple of ",
              3 * num_heads, ")");
  EMBER_CHECK(dropout_p >= 0.0 && dropout_p <= 1.0, op, ": dropout probability must be in [0, 1], got ", dropout_p,
              " (qkv of shape ", qkv_in.shape(), ")");
  const Tensor qkv = autocast::to_lower(qkv_in);  // the products' policy
  const int64_t b = qkv.size(0), len = qkv.size(1), e = qkv.size(2) / 3, d = e / num_heads;
  const double scale = 1.0 / std::sqrt(double(d));
  const double p = training ? dropout_p : 0.0;
  const bool kernel_dtype = qkv.dtype() == DType::f32 || qkv.dtype() == DType::bf16 || qkv.dtype() == DType::f64;
  // a library that takes the problem (cuDNN's fused attention on a GPU) runs the op itself
  const bool library = kernel_dtype && native::attention_library_takes(qkv.device(), qkv.dtype(), d, d,
                                                                        mask.defined(), p);
  if (!library && (!native::fused_attention_on(qkv.device(), d) || !kernel_dtype || p == 1.0 || wants(mask))) {
    // The composition itself.
    auto head = [&](int64_t i) { return qkv.narrow(2, i * e, e).view({b, len, num_heads, d}).transpose(1, 2); };
    const Tensor scores = matmul(head(0), head(1).transpose(-2, -1));
    const Tensor probs = scaled_masked_softmax(scores, mask, scale, p, true, scores.dtype());
    return matmul(probs, head(2)).transpose(1, 2).reshape({b, len, e});
  }
  native::PackedAttentionResult r = native::packed_self_attention(qkv, num_heads, mask, scale, p);
  if (autograd::needs_grad({qkv})) {
    // qkv itself when contiguous: saved without history, checked for in-place changes.
    const autograd::SavedTensor sqkv = autograd::save(r.saved.qkv), sm = autograd::save(r.saved.mask);
    r.saved.qkv = Tensor();
    r.saved.mask = Tensor();
    const double drop_scale = p > 0.0 ? 1.0 / (1.0 - p) : 1.0;
    // qkv with its history and the caller's mask, for the composed gradient.
    autograd::record(
        "PackedSelfAttentionBackward", {qkv}, {r.ctx},
        [stats = r.saved, sqkv, sm, hqkv = autograd::save_with_history(qkv), additive = autograd::save(mask), num_heads,
         scale, drop_scale](const Tensors& g) -> Tensors {
          native::PackedAttentionSaved saved = stats;
          saved.qkv = sqkv.unpack();
          saved.mask = sm.unpack();
          const Tensor qkv_v = hqkv.unpack();
          return autograd::with_composed_history(
              "PackedSelfAttentionGradBackward", {native::packed_self_attention_backward(g[0], saved, drop_scale)},
              {g[0], qkv_v}, [&] {
                return Tensors{autograd::packed_attention_gradient(g[0], qkv_v, num_heads, additive.unpack(),
                                                                   saved.keep, scale, drop_scale)};
              });
        },
        autograd::Backward::differentiable);
  }
  return r.ctx;
}

}  // namespace ember

namespace ember {
namespace {

// The additive form of an attention mask: a bool mask (true takes part) becomes 0 / -inf in the
// scores' compute dtype; a floating one is itself.
Tensor additive_mask(const Tensor& mask, DType scores) {
  if (!mask.defined() || mask.dtype() != DType::boolean) return mask;
  const TensorOptions opt{scores == DType::f64 ? DType::f64 : DType::f32, mask.device()};
  return where(mask, full({}, 0.0, opt), full({}, -std::numeric_limits<double>::infinity(), opt));
}

// The causal mask [L, S] in additive form: key j takes no part in query i when j > i.
Tensor causal_mask(int64_t len_q, int64_t len_k, DType scores, Device device) {
  const TensorOptions i64{DType::i64, device};
  const Tensor rows = arange(0, double(len_q), 1, i64).view({len_q, 1});
  const Tensor cols = arange(0, double(len_k), 1, i64).view({1, len_k});
  return additive_mask(le(cols, rows), scores);
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                    const Tensor& attn_mask, double dropout_p, bool is_causal,
                                    std::optional<double> scale_opt) {
  constexpr const char* op = "scaled_dot_product_attention";
  EMBER_CHECK(q_in.defined() && k_in.defined() && v_in.defined(), op, ": query, key and value must be defined");
  EMBER_CHECK(q_in.dim() >= 2 && k_in.dim() >= 2 && v_in.dim() >= 2, op,
              ": query, key and value need at least 2 dims, got shapes ", q_in.shape(), ", ", k_in.shape(), " and ",
              v_in.shape());
  EMBER_CHECK(!(is_causal && attn_mask.defined()), op, ": give either attn_mask or is_causal, not both (attn_mask of shape ",
              attn_mask.defined() ? attn_mask.shape() : Shape{}, ", query of shape ", q_in.shape(), ")");
  EMBER_CHECK(dropout_p >= 0.0 && dropout_p <= 1.0, op, ": dropout probability must be in [0, 1], got ", dropout_p,
              " (query of shape ", q_in.shape(), ")");
  const Tensor q = autocast::to_lower(q_in), k = autocast::to_lower(k_in), v = autocast::to_lower(v_in);
  EMBER_CHECK(q.dtype() == k.dtype() && k.dtype() == v.dtype(), op, ": query, key and value must share a dtype, got ",
              dtype_name(q.dtype()), ", ", dtype_name(k.dtype()), " and ", dtype_name(v.dtype()));
  const double scale = scale_opt ? *scale_opt : 1.0 / std::sqrt(double(q.size(-1)));
  const DType scores_dtype = native::fused_compute_dtype(q.dtype());
  const Tensor mask = additive_mask(attn_mask, scores_dtype);
  const bool kernel_dtype = q.dtype() == DType::f32 || q.dtype() == DType::bf16 || q.dtype() == DType::f64;
  // the CUDA kernel takes one head dim for q, k and v
  const bool kernel_dims = q.device().is_cpu() || q.size(-1) == v.size(-1);
  // a library that takes the problem (cuDNN's fused attention on a GPU, f16 included) runs the op
  const bool library = native::attention_library_takes(q.device(), q.dtype(), q.size(-1), v.size(-1),
                                                       mask.defined(), dropout_p);
  if (!library && (!native::fused_attention_on(q.device(), q.size(-1)) || !kernel_dtype || !kernel_dims ||
                   dropout_p == 1.0 || wants(mask))) {
    // The composition itself (also where the kernel's CUDA version does not run).
    const Tensor scores = matmul(q, k.transpose(-2, -1));
    const Tensor m = is_causal ? causal_mask(q.size(-2), k.size(-2), scores_dtype, q.device()) : mask;
    const Tensor probs = scaled_masked_softmax(scores, m, scale, dropout_p, true, scores.dtype());
    return matmul(probs, v);
  }
  native::AttentionResult r = native::scaled_dot_product_attention(q, k, v, mask, is_causal, scale, dropout_p);
  if (autograd::needs_grad({q, k, v})) {
    // The operands' data (views of q, k and v, or copies), saved without history and checked for
    // in-place changes.
    native::AttentionProblem& a = r.saved.problem;
    const autograd::SavedTensor sq = autograd::save(a.q.data), sk = autograd::save(a.k.data),
                                sv = autograd::save(a.v.data), sm = autograd::save(a.mask);
    a.q.data = a.k.data = a.v.data = a.mask = Tensor();
    const double drop_scale = dropout_p > 0.0 ? 1.0 / (1.0 - dropout_p) : 1.0;
    const Shape q_shape = q.shape(), k_shape = k.shape(), v_shape = v.shape();
    // q, k and v with their history and the additive mask, for the composed gradient.
    autograd::record(
        "ScaledDotProductAttentionBackward", {q, k, v}, {r.out},
        [saved = r.saved, sq, sk, sv, sm, hq = autograd::save_with_history(q), hk = autograd::save_with_history(k),
         hv = autograd::save_with_history(v), additive = autograd::save(mask), is_causal, scale, scores_dtype,
         drop_scale, q_shape, k_shape, v_shape](const Tensors& g) -> Tensors {
          native::AttentionSaved s = saved;
          s.problem.q.data = sq.unpack();
          s.problem.k.data = sk.unpack();
          s.problem.v.data = sv.unpack();
          s.problem.mask = sm.unpack();
          const native::AttentionGrads d = native::scaled_dot_product_attention_backward(g[0], s, drop_scale);
          const Tensor qv = hq.unpack(), kv = hk.unpack(), vv = hv.unpack();
          return autograd::with_composed_history(
              "ScaledDotProductAttentionGradBackward",
              {sum_to_shape(d.dq, q_shape), sum_to_shape(d.dk, k_shape), sum_to_shape(d.dv, v_shape)},
              {g[0], qv, kv, vv}, [&] {
                const Tensor m = is_causal ? causal_mask(qv.size(-2), kv.size(-2), scores_dtype, qv.device())
                                           : additive.unpack();
                return autograd::attention_gradients(g[0], qv, kv, vv, m, saved.keep, scale, drop_scale);
              });
        },
        autograd::Backward::differentiable);
  }
  return r.out;
}

}  // namespace ember
