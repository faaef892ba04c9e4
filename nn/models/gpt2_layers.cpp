#include "nn/models/gpt2_layers.h"

#include <cmath>
#include <utility>

#include "core/factory.h"
#include "core/ops.h"

namespace ember::nn {

Conv1D::Conv1D(int64_t in_features, int64_t out_features) : Module("Conv1D") {
  // Overwritten by the model's initialisation (normal(0, initializer_range), zero bias).
  weight = register_parameter("weight", zeros({in_features, out_features}));
  bias = register_parameter("bias", zeros({out_features}));
}

// linear() takes [out, in]: the transposed view is read in place by the GEMM.
Tensor Conv1D::product(const Tensor& x) const { return linear(x, weight.transpose(0, 1)); }

Tensor Conv1D::forward(const Tensor& x) {
  auto scope = enter_forward();
  return scope.exit(linear(x, weight.transpose(0, 1), bias));
}

GPT2Attention::GPT2Attention(const GPT2Config& c, int64_t layer_idx)
    : Module("GPT2Attention"), num_heads(c.n_head), head_dim(c.n_embd / c.n_head), attn_pdrop(c.attn_pdrop) {
  scale = c.scale_attn_weights ? 1.0 / std::sqrt(double(head_dim)) : 1.0;
  if (c.scale_attn_by_inverse_layer_idx) scale /= double(layer_idx + 1);
  c_attn = register_module("c_attn", std::make_shared<Conv1D>(c.n_embd, 3 * c.n_embd));
  c_proj = register_module("c_proj", std::make_shared<Conv1D>(c.n_embd, c.n_embd));
  resid_dropout = register_module("resid_dropout", std::make_shared<Dropout>(c.resid_pdrop));
}

Tensor GPT2Attention::forward(const Tensor& hidden, const Tensor& additive_mask, GPT2LayerCache* cache) {
  auto scope = enter_forward();
  const int64_t b = hidden.size(0), len = hidden.size(1), e = num_heads * head_dim;
  const Tensor qkv = c_attn->forward(hidden);
  // [B, L, 3E] -> three [B, heads, L, D] views of it (read in place by the attention kernel)
  auto head = [&](int64_t i) { return qkv.narrow(2, i * e, e).view({b, len, num_heads, head_dim}).transpose(1, 2); };
  Tensor keys = head(1), values = head(2);
  int64_t cached = 0;
  if (cache) {
    cached = cache->keys.defined() ? cache->keys.size(2) : 0;
    // The cache owns its keys and values: copies, not views that would keep the whole qkv alive.
    keys = cached ? cat({cache->keys, keys}, 2) : keys.contiguous();
    values = cached ? cat({cache->values, values}, 2) : values.contiguous();
    cache->keys = keys;
    cache->values = values;
  }
  const double p = is_training() ? attn_pdrop : 0.0;
  const bool causal = !additive_mask.defined() && cached == 0;
  const Tensor ctx = scaled_dot_product_attention(head(0), keys, values, additive_mask, p, causal, scale);
  const Tensor merged = ctx.transpose(1, 2).reshape({b, len, e});
  return scope.exit(resid_dropout->forward(c_proj->forward(merged)));
}

GPT2MLP::GPT2MLP(const GPT2Config& c) : Module("GPT2MLP"), act(c.activation_function) {
  c_fc = register_module("c_fc", std::make_shared<Conv1D>(c.n_embd, c.inner_size()));
  c_proj = register_module("c_proj", std::make_shared<Conv1D>(c.inner_size(), c.n_embd));
  dropout = register_module("dropout", std::make_shared<Dropout>(c.resid_pdrop));
}

Tensor GPT2MLP::forward(const Tensor& x) {
  auto scope = enter_forward();
  Tensor h;
  if (act == "relu") {
    h = relu(c_fc->forward(x));
  } else {
    h = bias_gelu(c_fc->product(x), c_fc->bias, /*tanh_approx=*/act != "gelu");
  }
  return scope.exit(dropout->forward(c_proj->forward(h)));
}

GPT2Block::GPT2Block(const GPT2Config& c, int64_t layer_idx) : Module("GPT2Block") {
  ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(Shape{c.n_embd}, c.layer_norm_epsilon));
  attn = register_module("attn", std::make_shared<GPT2Attention>(c, layer_idx));
  ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(Shape{c.n_embd}, c.layer_norm_epsilon));
  mlp = register_module("mlp", std::make_shared<GPT2MLP>(c));
}

Tensor GPT2Block::forward(const Tensor& x, const Tensor& additive_mask, GPT2LayerCache* cache) {
  auto scope = enter_forward();
  const Tensor h = x + attn->forward(ln_1->forward(x), additive_mask, cache);
  return scope.exit(h + mlp->forward(ln_2->forward(h)));
}

}  // namespace ember::nn
