// Multi-head attention and the Transformer encoder layer.
#pragma once
#include "nn/layers/basic.h"

namespace ember::nn {

// Batch-first multi-head self/cross attention with separate q/k/v/out projections.
class MultiheadAttention : public Module {
 public:
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, double dropout = 0.0, bool bias = true);
  // query [B, Lq, E], key/value [B, Lk, E]; key_padding_mask [B, Lk] (true = ignore).
  Tensor forward(const Tensor& query, const Tensor& key, const Tensor& value,
                 const Tensor& key_padding_mask = Tensor(), bool causal = false);
  Tensor forward(const Tensor& x) override { return forward(x, x, x); }

  int64_t embed_dim, num_heads, head_dim;
  double dropout_p;
  std::shared_ptr<Linear> q_proj, k_proj, v_proj, out_proj;
};

struct TransformerEncoderLayerOptions {
  int64_t d_model = 256;
  int64_t nhead = 4;
  int64_t dim_feedforward = 1024;
  double dropout = 0.1;
  bool norm_first = false;  // false: post-LN (original Transformer, BERT); true: pre-LN
  double layer_norm_eps = 1e-5;
  bool gelu = true;         // activation: GELU (true) or ReLU
};

class TransformerEncoderLayer : public Module {
 public:
  explicit TransformerEncoderLayer(TransformerEncoderLayerOptions opt);
  Tensor forward(const Tensor& x, const Tensor& key_padding_mask, bool causal = false);
  Tensor forward(const Tensor& x) override { return forward(x, Tensor()); }

  TransformerEncoderLayerOptions opt;
  std::shared_ptr<MultiheadAttention> self_attn;
  std::shared_ptr<Linear> linear1, linear2;
  std::shared_ptr<LayerNorm> norm1, norm2;
  std::shared_ptr<Dropout> dropout, dropout1, dropout2;

 private:
  Tensor feed_forward(const Tensor& x);
};

}  // namespace ember::nn
