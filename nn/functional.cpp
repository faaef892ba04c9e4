#include "nn/functional.h"

#include <cmath>
#include <limits>

#include "core/autocast.h"
#include "core/factory.h"

namespace ember::nn::functional {

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                    double dropout_p, bool training, bool causal) {
  const double p = training ? dropout_p : 0.0;
  if (!(causal && mask.defined())) return ember::scaled_dot_product_attention(q, k, v, mask, p, causal);
  // The fused op takes a mask or is_causal: both go in as one additive mask.
  const int64_t lq = q.size(-2), lk = k.size(-2);
  Tensor i = arange(lq, {DType::i64, q.device()}).view({lq, 1});
  Tensor j = arange(lk, {DType::i64, q.device()}).view({1, lk});
  Tensor future = masked_fill(zeros({lq, lk}, {DType::f32, q.device()}), gt(j, i),
                              -std::numeric_limits<double>::infinity());
  return ember::scaled_dot_product_attention(q, k, v, mask + future, p);
}

Tensor padding_mask_to_additive(const Tensor& key_padding_mask, DType dtype) {
  EMBER_CHECK(key_padding_mask.dim() == 2, "padding_mask_to_additive: expected [batch, length], got ",
              key_padding_mask.shape());
  const int64_t b = key_padding_mask.size(0), l = key_padding_mask.size(1);
  Tensor pad = ne(key_padding_mask.to(DType::f32), 0.0);
  // A large finite value rather than -inf keeps fully padded rows finite (uniform weights).
  const double neg = dtype == DType::f16 ? -65504.0 : -1e9;
  return masked_fill(zeros({b, l}, {dtype}), pad, neg).view({b, 1, 1, l});
}

Tensor mse_loss(const Tensor& input_in, const Tensor& target_in, Reduction reduction) {
  const Tensor input = autocast::to_f32(input_in), target = autocast::to_f32(target_in);
  EMBER_CHECK(input.shape() == target.shape(), "mse_loss: input shape ", input.shape(),
              " and target shape ", target.shape(), " differ");
  Tensor d = input - target;
  Tensor sq = d * d;
  switch (reduction) {
    case Reduction::None: return sq;
    case Reduction::Sum: return sum(sq);
    default: return mean(sq);
  }
}

}  // namespace ember::nn::functional
