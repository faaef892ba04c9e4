// Composite functions used by layers: attention and losses.
#pragma once
#include "core/ops.h"

namespace ember::nn::functional {

// softmax(q k^T * scale + mask) v over the last two dims. q [..., Lq, D], k/v [..., Lk, D].
// additive_mask broadcasts to [..., Lq, Lk] (0 keep, large negative drop); causal masks j > i.
// The fused ember::scaled_dot_product_attention (core/ops.h), dropout only while training; a
// mask and causal may come together (added into one mask).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& additive_mask = Tensor(), double dropout_p = 0.0,
                                    bool training = false, bool causal = false);
// [B, L] key-padding mask (true or 1 = padding) -> additive [B, 1, 1, L] mask in `dtype`.
Tensor padding_mask_to_additive(const Tensor& key_padding_mask, DType dtype = DType::f32);
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);

}  // namespace ember::nn::functional
