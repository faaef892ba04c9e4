#include "nn/layers/attention.h"

#include <limits>

#include "core/autocast.h"
#include "core/factory.h"
#include "nn/functional.h"

namespace ember::nn {

MultiheadAttention::MultiheadAttention(int64_t e, int64_t h, double dropout, bool bias)
    : Module("MultiheadAttention"), embed_dim(e), num_heads(h), head_dim(h > 0 ? e / h : 0), dropout_p(dropout) {
  EMBER_CHECK(h > 0 && e % h == 0, "MultiheadAttention: embed_dim ", e, " is not divisible by num_heads ", h);
  q_proj = register_module("q_proj", std::make_shared<Linear>(e, e, LinearOptions{bias}));
  k_proj = register_module("k_proj", std::make_shared<Linear>(e, e, LinearOptions{bias}));
  v_proj = register_module("v_proj", std::make_shared<Linear>(e, e, LinearOptions{bias}));
  out_proj = register_module("out_proj", std::make_shared<Linear>(e, e, LinearOptions{bias}));
}

Tensor MultiheadAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                   const Tensor& key_padding_mask, bool causal) {
  auto scope = enter_forward();
  EMBER_CHECK(query.dim() == 3 && key.dim() == 3 && value.dim() == 3 && query.size(2) == embed_dim,
              "MultiheadAttention: expected [batch, length, ", embed_dim, "] inputs, got query ", query.shape(),
              ", key ", key.shape(), ", value ", value.shape());
  const int64_t b = query.size(0), lq = query.size(1), lk = key.size(1);
  if (key_padding_mask.defined()) {
    EMBER_CHECK(key_padding_mask.dim() == 2 && key_padding_mask.size(0) == b && key_padding_mask.size(1) == lk,
                "MultiheadAttention: key_padding_mask must be [", b, ", ", lk, "], got ", key_padding_mask.shape());
  }
  if (query.is_same(key) && key.is_same(value)) {
    // Self-attention: q, k and v from one product with the three weights stacked, and the heads
    // read in place and written merged (packed_self_attention), so no per-head copies.
    auto stacked = [](const Tensor& wq, const Tensor& wk, const Tensor& wv) {
      return wq.defined() ? cat({autocast::to_lower(wq), autocast::to_lower(wk), autocast::to_lower(wv)}, 0) : Tensor();
    };
    const Tensor qkv = linear(query, stacked(q_proj->weight, k_proj->weight, v_proj->weight),
                              stacked(q_proj->bias, k_proj->bias, v_proj->bias));
    Tensor mask;
    if (key_padding_mask.defined()) mask = functional::padding_mask_to_additive(key_padding_mask, qkv.dtype());
    if (causal) {
      Tensor i = arange(lq, {DType::i64, query.device()}).view({lq, 1});
      Tensor j = arange(lk, {DType::i64, query.device()}).view({1, lk});
      Tensor future = masked_fill(zeros({lq, lk}, {DType::f32, query.device()}), gt(j, i),
                                  -std::numeric_limits<double>::infinity());
      mask = mask.defined() ? mask + future : future;
    }
    return scope.exit(out_proj->forward(packed_self_attention(qkv, num_heads, mask, dropout_p, is_training())));
  }
  auto heads = [&](const Tensor& t, int64_t len) {
    return t.view({b, len, num_heads, head_dim}).transpose(1, 2);  // [B, H, L, D]
  };
  Tensor q = heads(q_proj->forward(query), lq);
  Tensor k = heads(k_proj->forward(key), lk);
  Tensor v = heads(v_proj->forward(value), lk);
  Tensor mask;
  if (key_padding_mask.defined()) mask = functional::padding_mask_to_additive(key_padding_mask, q.dtype());
  Tensor ctx = functional::scaled_dot_product_attention(q, k, v, mask, dropout_p, is_training(), causal);
  return scope.exit(out_proj->forward(ctx.transpose(1, 2).reshape({b, lq, embed_dim})));
}

TransformerEncoderLayer::TransformerEncoderLayer(TransformerEncoderLayerOptions o)
    : Module("TransformerEncoderLayer"), opt(o) {
  self_attn = register_module("self_attn", std::make_shared<MultiheadAttention>(o.d_model, o.nhead, o.dropout));
  linear1 = register_module("linear1", std::make_shared<Linear>(o.d_model, o.dim_feedforward));
  dropout = register_module("dropout", std::make_shared<Dropout>(o.dropout));
  linear2 = register_module("linear2", std::make_shared<Linear>(o.dim_feedforward, o.d_model));
  norm1 = register_module("norm1", std::make_shared<LayerNorm>(Shape{o.d_model}, o.layer_norm_eps));
  norm2 = register_module("norm2", std::make_shared<LayerNorm>(Shape{o.d_model}, o.layer_norm_eps));
  dropout1 = register_module("dropout1", std::make_shared<Dropout>(o.dropout));
  dropout2 = register_module("dropout2", std::make_shared<Dropout>(o.dropout));
}

namespace {
// dropout(act(linear1(x))): GELU takes linear1's bias inside the fused activation.
Tensor feed_forward_hidden(bool use_gelu, Linear& linear1, Dropout& dropout, const Tensor& x) {
  Tensor h = use_gelu && linear1.bias.defined() ? bias_gelu(linear(x, linear1.weight), linear1.bias)
             : use_gelu                          ? gelu(linear1.forward(x))
                                                 : relu(linear1.forward(x));
  return dropout.forward(h);
}
}  // namespace

Tensor TransformerEncoderLayer::feed_forward(const Tensor& x) {
  return dropout2->forward(linear2->forward(feed_forward_hidden(opt.gelu, *linear1, *dropout, x)));
}

Tensor TransformerEncoderLayer::forward(const Tensor& x, const Tensor& key_padding_mask, bool causal) {
  auto scope = enter_forward();
  if (opt.norm_first) {
    Tensor n1 = norm1->forward(x);
    Tensor h = x + dropout1->forward(self_attn->forward(n1, n1, n1, key_padding_mask, causal));
    return scope.exit(h + feed_forward(norm2->forward(h)));
  }
  // Post-norm: each residual sum, its dropout and the norm after it are one fused op.
  Tensor a = self_attn->forward(x, x, x, key_padding_mask, causal);
  Tensor h = add_layer_norm(a, x, norm1->normalized_shape, norm1->weight, norm1->bias, norm1->eps, dropout1->p,
                            dropout1->is_training());
  Tensor f = linear(feed_forward_hidden(opt.gelu, *linear1, *dropout, h), linear2->weight);
  return scope.exit(add_layer_norm(f, h, norm2->normalized_shape, norm2->weight, norm2->bias, norm2->eps,
                                   dropout2->p, dropout2->is_training(), linear2->bias));
}

}  // namespace ember::nn
