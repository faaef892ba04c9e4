// Fused ops without autograd: each computes a short chain of ops in one or two passes over
// memory instead of one pass per op (argument checks, output allocation, then one device kernel).
// autograd/functions/fused.cpp adds their backward passes and the autocast policy.
//
// All of them work on rows: x is viewed as [rows, cols] with cols its last dim (or the product
// of the normalised dims for the layer norm). Computation is in float for f32, bf16 and f16 data
// and in double for f64; statistics saved for the backward are in that compute dtype.
#pragma once
#include "core/dispatch.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace ember::native {

// The compute dtype of a fused op whose data has dtype `dt`: f64 for f64, f32 otherwise.
DType fused_compute_dtype(DType dt);

// Dropout inside a fused op: p == 0 means none. Element e (row-major over the tensor it
// applies to) keeps exactly as in native::dropout with the same generator state.
struct FusedDropout {
  double p = 0.0;
  double scale = 1.0;  // 1 / (1 - p)
  GeneratorState state;
  bool active() const { return p > 0.0; }
};
// Draws the dropout of `numel` elements from `gen` (p in [0, 1); p == 0 draws nothing).
FusedDropout make_fused_dropout(double p, int64_t numel, const char* op, Generator& gen = default_generator());

// ---- bias + GELU: y = gelu(x + bias), bias [cols] added to every row.
// x, y [rows, cols] contiguous, one dtype; bias contiguous [cols] in the compute dtype.
EMBER_DECLARE_STUB(bias_gelu_stub, void (*)(const Tensor& y, const Tensor& x, const Tensor& bias, bool tanh_approx));
// dx = grad * gelu'(x + bias) (x's dtype) and dbias = the column sums of dx (compute dtype, summed
// from the unrounded products); either output may be undefined.
EMBER_DECLARE_STUB(bias_gelu_backward_stub, void (*)(const Tensor& dx, const Tensor& dbias, const Tensor& grad,
                                                     const Tensor& x, const Tensor& bias, bool tanh_approx));

// x [..., C], bias [C] (any floating dtype; converted to the compute dtype). Result in x's dtype.
Tensor bias_gelu(const Tensor& x, const Tensor& bias, bool tanh_approx);
struct BiasGeluGrads {
  Tensor dx, dbias;  // dx in x's dtype; dbias [C] in the compute dtype
};
BiasGeluGrads bias_gelu_backward(const Tensor& grad, const Tensor& x, const Tensor& bias, bool tanh_approx,
                                 bool need_dx, bool need_dbias);

// ---- residual add + layer norm: h = dropout(x + x_bias) + residual, y = layer_norm(h) * weight + bias
// over rows of cols. x and residual [rows, cols] contiguous, each f32, bf16 or f16 (or both f64);
// x_bias, weight, bias undefined or [cols] in the compute dtype; y in any floating dtype. Saves
// h (compute dtype), per-row mean and rstd, and the dropout's keep mask (bool) when it drops.
EMBER_DECLARE_STUB(add_layer_norm_stub,
                   void (*)(const Tensor& y, const Tensor& h, const Tensor& mean, const Tensor& rstd,
                            const Tensor& keep, const Tensor& x, const Tensor& residual, const Tensor& x_bias,
                            const Tensor& weight, const Tensor& bias, double eps, const FusedDropout& dropout));
// From grad [rows, cols] (y's dtype): dresidual = dh (residual's dtype), dx = dropout_backward(dh)
// (x's dtype), dx_bias = column sums of dx, dweight = column sums of grad * xhat, dbias = column
// sums of grad (all three in the compute dtype). Any output may be undefined; weight undefined
// means ones.
EMBER_DECLARE_STUB(add_layer_norm_backward_stub,
                   void (*)(const Tensor& dx, const Tensor& dresidual, const Tensor& dx_bias, const Tensor& dweight,
                            const Tensor& dbias, const Tensor& grad, const Tensor& h, const Tensor& mean,
                            const Tensor& rstd, const Tensor& weight, const Tensor& keep, double dropout_scale));

// What the backward reads (never the output itself, so saving it makes no reference cycle).
struct AddLayerNormSaved {
  Tensor h, mean, rstd, keep;  // keep undefined without dropout
  Shape shape;                 // of x, residual and y
  DType y_dtype = DType::f32;
};
struct AddLayerNormResult {
  Tensor y;
  AddLayerNormSaved saved;
};
// x and residual of one shape; normalized_shape the trailing dims of x; weight, bias of that
// shape (or undefined); x_bias [cols] or undefined. y has dtype out_dtype.
AddLayerNormResult add_layer_norm(const Tensor& x, const Tensor& residual, const Shape& normalized_shape,
                                  const Tensor& weight, const Tensor& bias, const Tensor& x_bias, double eps,
                                  double dropout_p, DType out_dtype, Generator& gen = default_generator());
struct AddLayerNormGrads {
  Tensor dx, dresidual, dx_bias, dweight, dbias;  // dx_bias, dweight, dbias in the compute dtype
};
// Wanted gradients only; dx and dresidual are one tensor when they coincide (same dtype, no
// dropout) and `share` allows it, else two tensors written by the same pass (cheaper than a copy
// made later, as a leaf's gradient accumulator makes of a tensor another consumer holds).
AddLayerNormGrads add_layer_norm_backward(const Tensor& grad, const AddLayerNormSaved& saved, const Tensor& weight,
                                          DType x_dtype, DType residual_dtype, double dropout_scale, bool need_dx,
                                          bool need_dresidual, bool need_dx_bias, bool need_dweight, bool need_dbias,
                                          bool share = true);

// ---- scale + additive mask + softmax (+ dropout) over the last dim:
//   y = dropout(softmax(x * scale + mask)).
// x [rows, len] contiguous (any floating dtype); mask undefined or x's shape through broadcast
// strides (any floating dtype); y [rows, len] (out dtype). stats [rows, 2] (compute dtype) gets
// the row maximum of x * scale + mask and 1 / sum of the exponentials, from which the backward
// recomputes the probabilities exactly instead of saving them.
EMBER_DECLARE_STUB(scaled_masked_softmax_stub,
                   void (*)(const Tensor& y, const Tensor& stats, const Tensor& keep, const Tensor& x,
                            const Tensor& mask, double scale, const FusedDropout& dropout));
// ds = softmax_backward(dropout_backward(grad)) written into dx (x's dtype) as out_scale * ds;
// `scale` is the forward's, for recomputing the probabilities.
EMBER_DECLARE_STUB(scaled_masked_softmax_backward_stub,
                   void (*)(const Tensor& dx, const Tensor& grad, const Tensor& x, const Tensor& mask,
                            const Tensor& stats, const Tensor& keep, double scale, double out_scale,
                            double dropout_scale));

// What the backward reads (mask broadcast to x's shape; keep undefined without dropout).
struct ScaledMaskedSoftmaxSaved {
  Tensor x, mask, stats, keep;
  DType y_dtype = DType::f32;
};
struct ScaledMaskedSoftmaxResult {
  Tensor y;
  ScaledMaskedSoftmaxSaved saved;
};
// x [..., len]; mask broadcastable to x (or undefined); y has dtype out_dtype.
ScaledMaskedSoftmaxResult scaled_masked_softmax(const Tensor& x, const Tensor& mask, double scale, double dropout_p,
                                                DType out_dtype, Generator& gen = default_generator());
// Gradient for x (x's dtype) with `out_scale` in place of the forward scale (1 gives the
// gradient of the masked scores themselves).
Tensor scaled_masked_softmax_backward(const Tensor& grad, const ScaledMaskedSoftmaxSaved& saved, double scale,
                                      double out_scale, double dropout_scale);

// ---- attention: out = dropout(softmax(q k^T * scale + mask)) v for every (batch, head) pair
// Pairs are numbered outer * inner + n (n < inner): the packed projection's (batch, head), or the
// leading dims of scaled_dot_product_attention collapsed into two. An operand's pair starts
// `offset(pair)` elements into its tensor; its rows are row_stride apart, its columns contiguous.
// The kernels read q, k, v and write out in place this way (no per-head copies).
struct AttentionOperand {
  Tensor data;  // its first pair's first element is data's first element
  int64_t outer_stride = 0, inner_stride = 0, row_stride = 0;
  int64_t offset(int64_t pair, int64_t inner) const { return (pair / inner) * outer_stride + (pair % inner) * inner_stride; }
};
struct AttentionProblem {
  AttentionOperand q, k, v;  // [pairs, len_q, dim_qk], [pairs, len_k, dim_qk], [pairs, len_k, dim_v]; one dtype
  Tensor mask;  // additive, [outer, inner, len_q, len_k] through broadcast strides, floating; or undefined
  int64_t outer = 0, inner = 1, len_q = 0, len_k = 0, dim_qk = 0, dim_v = 0;
  bool causal = false;  // key j takes no part in query row i when j > i
  double scale = 1.0;
  int64_t pairs() const { return outer * inner; }
};
// out [pairs, len_q, dim_v] (the data dtype) gets the attention of each pair. The scores and
// probabilities of a pair live in a per-thread buffer only: stats [pairs * len_q, 2] (compute
// dtype) keeps each score row's max and 1 / sum and keep [pairs, len_q, len_k] (bool) the dropout
// mask (element (pair, i, j) keeps as native::dropout's element of that index), from which the
// backward recomputes them. Causal rows compute and read only the keys they see.
EMBER_DECLARE_STUB(attention_stub, void (*)(const AttentionProblem& a, const AttentionOperand& out,
                                            const Tensor& stats, const Tensor& keep, const FusedDropout& dropout));
// dq, dk, dv (each laid out as its input; the data dtype) from grad (laid out as out).
EMBER_DECLARE_STUB(attention_backward_stub,
                   void (*)(const AttentionProblem& a, const AttentionOperand& grad, const AttentionOperand& dq,
                            const AttentionOperand& dk, const AttentionOperand& dv, const Tensor& stats,
                            const Tensor& keep, double dropout_scale));

// The same two passes through a library (cuDNN's fused attention on CUDA; no CPU kernel). Each
// returns false, having written nothing, when the library declines the problem; Ember's kernels
// then run. The library's forward writes each stats row as (logsumexp of the scores, 1), which
// Ember's backward reads as (max, 1 / sum) of the same probabilities.
EMBER_DECLARE_STUB(attention_library_stub, bool (*)(const AttentionProblem& a, const AttentionOperand& out,
                                                    const Tensor& stats, const FusedDropout& dropout));
EMBER_DECLARE_STUB(attention_library_backward_stub,
                   bool (*)(const AttentionProblem& a, const AttentionOperand& grad, const AttentionOperand& dq,
                            const AttentionOperand& dk, const AttentionOperand& dv, const Tensor& stats,
                            const Tensor& keep, double dropout_scale));
// Whether the library is asked at all for q, k and v of dtype `dt` with these head dims, an
// additive mask or not and this dropout (its switch, dtypes and limits; shapes it refuses later
// still decline).
EMBER_DECLARE_STUB(attention_library_takes_stub,
                   bool (*)(DType dt, int64_t dim_qk, int64_t dim_v, bool masked, double dropout_p));
bool attention_library_takes(Device d, DType dt, int64_t dim_qk, int64_t dim_v, bool masked, double dropout_p);

// Whether packed_self_attention and scaled_dot_product_attention take the attention kernels on
// device `d` rather than the composition matmul -> scaled_masked_softmax -> matmul (a problem
// the library takes, attention_library_takes, always goes to the attention op first). Always on the CPU. On a GPU only when the
// environment says EMBER_CUDA_ATTENTION=fused and head_dim <= 256: the fused CUDA kernel does
// its products on CUDA cores, while the composition's GEMMs run on tensor cores.
bool fused_attention_on(Device d, int64_t head_dim);

// ---- multi-head self-attention on one packed projection (through the attention stubs)
struct PackedAttentionSaved {
  Tensor qkv, mask, stats, keep;  // mask broadcast to [B, heads, L, L]; keep undefined without dropout
  int64_t heads = 1;
  double scale = 1.0;
};
struct PackedAttentionResult {
  Tensor ctx;
  PackedAttentionSaved saved;
};
// qkv [B, L, 3E] (f32, bf16 or f64), E divisible by heads; mask broadcastable to [B, heads, L, L].
PackedAttentionResult packed_self_attention(const Tensor& qkv, int64_t heads, const Tensor& mask, double scale,
                                            double dropout_p, Generator& gen = default_generator());
Tensor packed_self_attention_backward(const Tensor& grad, const PackedAttentionSaved& saved, double dropout_scale);

// ---- scaled_dot_product_attention: q [..., L, E], k [..., S, E], v [..., S, Ev] of one dtype (f32,
// bf16, f16 or f64; f16 that the library declines runs Ember's kernels on f32 copies), leading
// dims broadcasting; mask additive (floating; autograd/functions/fused.cpp
// turns a bool mask into 0 / -inf), broadcastable to [..., L, S], or undefined (not with causal). Result [..., L, Ev] in the inputs' dtype.
struct AttentionSaved {
  AttentionProblem problem;  // its operands the (broadcast) inputs
  Tensor stats, keep;
  Shape batch;  // the broadcast leading dims
};
struct AttentionResult {
  Tensor out;
  AttentionSaved saved;
};
AttentionResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                             bool causal, double scale, double dropout_p,
                                             Generator& gen = default_generator());
struct AttentionGrads {
  Tensor dq, dk, dv;  // each of shape batch + its own two trailing dims (sum over broadcast dims left to the caller)
};
AttentionGrads scaled_dot_product_attention_backward(const Tensor& grad, const AttentionSaved& saved,
                                                     double dropout_scale);

}  // namespace ember::native
