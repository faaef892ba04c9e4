// GPT-2's blocks, named and nested as in Hugging Face transformers (GPT2Block > GPT2Attention,
// GPT2MLP), so that their parameters read h.N.ln_1.weight, h.N.attn.c_attn.weight,
// h.N.mlp.c_fc.bias, ... Projections are transformers' Conv1D: weight [in, out], the transpose
// of Linear's, so that checkpoints load in both directions without reshuffling.
#pragma once
#include <memory>
#include <string>

#include "nn/layers/basic.h"
#include "nn/models/gpt2_config.h"

namespace ember::nn {

// One layer's keys and values of the tokens seen so far, [B, heads, T, head_dim] each (undefined
// before the first token): what incremental decoding keeps instead of recomputing them.
struct GPT2LayerCache {
  Tensor keys, values;
};

// y = x W + b with W [in_features, out_features] (transformers' Conv1D).
class Conv1D : public Module {
 public:
  Conv1D(int64_t in_features, int64_t out_features);
  Tensor forward(const Tensor& x) override;
  // x W without the bias, for callers that fuse the bias into what follows.
  Tensor product(const Tensor& x) const;
  Tensor weight, bias;
};

// Causal multi-head self-attention: c_attn projects to [q | k | v], scaled_dot_product_attention
// with the causal mask (or the additive mask given, which must include it), c_proj, dropout.
// With a cache, the new tokens' keys and values are appended to it and the queries attend to
// all of them: causally when the cache was empty, else to every key (one new token) or as the
// additive mask says (several; the model builds it).
class GPT2Attention : public Module {
 public:
  GPT2Attention(const GPT2Config& c, int64_t layer_idx);
  // hidden [B, L, E]; additive_mask [B, 1, L, T + L] (causal and padding; T cached tokens) or
  // undefined (causal only).
  Tensor forward(const Tensor& hidden, const Tensor& additive_mask, GPT2LayerCache* cache = nullptr);
  int64_t num_heads, head_dim;
  double scale, attn_pdrop;
  std::shared_ptr<Conv1D> c_attn, c_proj;
  std::shared_ptr<Dropout> resid_dropout;
};

// dropout(c_proj(act(c_fc(x)))), a GELU fused with c_fc's bias.
class GPT2MLP : public Module {
 public:
  explicit GPT2MLP(const GPT2Config& c);
  Tensor forward(const Tensor& x) override;
  std::string act;
  std::shared_ptr<Conv1D> c_fc, c_proj;
  std::shared_ptr<Dropout> dropout;
};

// Pre-LayerNorm block: h = x + attn(ln_1(x)); h + mlp(ln_2(h)).
class GPT2Block : public Module {
 public:
  GPT2Block(const GPT2Config& c, int64_t layer_idx);
  Tensor forward(const Tensor& x, const Tensor& additive_mask, GPT2LayerCache* cache = nullptr);
  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<GPT2Attention> attn;
  std::shared_ptr<GPT2MLP> mlp;
};

}  // namespace ember::nn
