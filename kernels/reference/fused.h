// Reference fused ops, written as the compositions they stand for (from the other reference
// ops), with their backward formulas, in double precision.
#pragma once
#include "kernels/reference/ref_tensor.h"

namespace ember::reference {

// gelu(x + bias), bias [C] added along the last dim of x.
RefTensor bias_gelu(const RefTensor& x, const RefTensor& bias, bool tanh_approx);
struct BiasGeluGrads {
  RefTensor dx, dbias;
};
BiasGeluGrads bias_gelu_backward(const RefTensor& g, const RefTensor& x, const RefTensor& bias, bool tanh_approx);

// layer_norm(dropout(x + x_bias) + residual) over the trailing normalized_ndim dims; x and
// residual of one shape. keep is the dropout mask (1 keeps, 0 drops) of probability p, or null
// for no dropout; weight, bias, x_bias may be null.
RefTensor add_layer_norm(const RefTensor& x, const RefTensor& residual, int64_t normalized_ndim,
                         const RefTensor* weight, const RefTensor* bias, const RefTensor* x_bias, const RefTensor* keep,
                         double p, double eps);
struct AddLayerNormGrads {
  RefTensor dx, dresidual, dweight, dbias, dx_bias;
};
AddLayerNormGrads add_layer_norm_backward(const RefTensor& g, const RefTensor& x, const RefTensor& residual,
                                          int64_t normalized_ndim, const RefTensor* weight, const RefTensor* x_bias,
                                          const RefTensor* keep, double p, double eps);

// dropout(softmax(x * scale + mask, -1)): mask broadcasts to x (or null); keep as above.
RefTensor scaled_masked_softmax(const RefTensor& x, const RefTensor* mask, double scale, const RefTensor* keep,
                                double p);
// The gradient with respect to x.
RefTensor scaled_masked_softmax_backward(const RefTensor& g, const RefTensor& x, const RefTensor* mask, double scale,
                                         const RefTensor* keep, double p);

// Multi-head self-attention on one packed projection qkv [B, L, 3E] (heads of D = E / heads
// columns in each third), scores scaled by 1 / sqrt(D); mask broadcasts to [B, heads, L, L] (or
// null); keep [B, heads, L, L] as above. Result [B, L, E], the heads merged.
RefTensor packed_self_attention(const RefTensor& qkv, int64_t heads, const RefTensor* mask, const RefTensor* keep,
                                double p);
// The gradient with respect to qkv.
RefTensor packed_self_attention_backward(const RefTensor& g, const RefTensor& qkv, int64_t heads, const RefTensor* mask,
                                         const RefTensor* keep, double p);

// scaled_dot_product_attention over n pairs: q [n, L, E], k [n, S, E], v [n, S, Ev] (the batch
// dims broadcast and flattened by the caller); mask additive, broadcasting to [n, L, S], or null;
// causal drops key j from row i when j > i; keep [n, L, S] as above. Result [n, L, Ev].
RefTensor scaled_dot_product_attention(const RefTensor& q, const RefTensor& k, const RefTensor& v, const RefTensor* mask,
                                       bool causal, double scale, const RefTensor* keep, double p);
struct AttentionGrads {
  RefTensor dq, dk, dv;
};
AttentionGrads scaled_dot_product_attention_backward(const RefTensor& g, const RefTensor& q, const RefTensor& k,
                                                     const RefTensor& v, const RefTensor* mask, bool causal,
                                                     double scale, const RefTensor* keep, double p);

}  // namespace ember::reference
