#include "data/mlm_collator.h"

#include <algorithm>

#include "core/factory.h"
#include "core/rng.h"

namespace ember::data {

MLMCollator::MLMCollator(MLMCollatorOptions opt) : opt_(std::move(opt)) {
  EMBER_CHECK(opt_.mlm_probability >= 0.0 && opt_.mlm_probability <= 1.0,
              "MLMCollator: mlm_probability must be in [0, 1], got ", opt_.mlm_probability);
  EMBER_CHECK(opt_.vocab_size > 0, "MLMCollator: vocab_size must be positive");
  pad_.pad_values = {{"input_ids", double(opt_.pad_token_id)}, {"attention_mask", 0.0}, {"token_type_ids", 0.0}};
  pad_.pad_to_multiple_of = opt_.pad_to_multiple_of;
}

std::pair<Tensor, Tensor> MLMCollator::mask_tokens(const Tensor& ids_in, const CollateContext& ctx) const {
  EMBER_CHECK(ids_in.dim() == 2, "MLMCollator: input_ids must be [batch, length], got ", ids_in.shape());
  Tensor ids = ids_in.to(DType::i64).contiguous().clone();
  Tensor labels = full(ids.shape(), -100.0, {DType::i64});
  int64_t* x = ids.data_ptr<int64_t>();
  int64_t* y = labels.data_ptr<int64_t>();
  const int64_t n = ids.numel();
  // One Philox stream per (epoch, batch): counter_hi = epoch << 32 | batch, counter_lo = position.
  const uint64_t stream = (uint64_t(ctx.epoch) << 32) ^ uint64_t(ctx.batch_index);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t tok = x[i];
    if (std::find(opt_.special_token_ids.begin(), opt_.special_token_ids.end(), tok) !=
        opt_.special_token_ids.end())
      continue;
    const auto r = Philox::draw(opt_.seed, stream, uint64_t(i));
    if (Philox::to_uniform(r[0]) >= opt_.mlm_probability) continue;
    y[i] = tok;
    const float action = Philox::to_uniform(r[1]);
    if (action < 0.8f) {
      x[i] = opt_.mask_token_id;
    } else if (action < 0.9f) {
      x[i] = int64_t(r[2] % uint32_t(opt_.vocab_size));
    }
  }
  return {ids, labels};
}

Batch MLMCollator::operator()(const std::vector<Example>& examples, const CollateContext& ctx) const {
  Batch b = pad_(examples, ctx);
  EMBER_CHECK(b.contains("input_ids"), "MLMCollator: examples need an 'input_ids' field");
  auto [ids, labels] = mask_tokens(b.at("input_ids"), ctx);
  b["input_ids"] = ids;
  b["labels"] = labels;
  return b;
}

}  // namespace ember::data
