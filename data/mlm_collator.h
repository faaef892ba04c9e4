// Masked-language-model batches as Hugging Face's DataCollatorForLanguageModeling makes them:
// 15% of the non-special tokens are chosen; of those 80% become [MASK], 10% a random token,
// 10% stay; labels hold the original id there and -100 elsewhere.
#pragma once
#include <vector>

#include "data/collate.h"

namespace ember::data {

struct MLMCollatorOptions {
  int64_t vocab_size = 30522;
  int64_t mask_token_id = 103;
  int64_t pad_token_id = 0;
  std::vector<int64_t> special_token_ids = {0, 100, 101, 102, 103};  // never masked
  double mlm_probability = 0.15;
  uint64_t seed = 0;
  int64_t pad_to_multiple_of = 1;
};

class MLMCollator {
 public:
  explicit MLMCollator(MLMCollatorOptions opt);
  // Examples hold "input_ids" (1-d, i64) and optionally "attention_mask"/"token_type_ids".
  // The draws depend only on (seed, epoch, batch index, position): any worker gives the same batch.
  Batch operator()(const std::vector<Example>& examples, const CollateContext& ctx) const;
  // Masks an already padded [B, L] id tensor in place of a copy; returns {input_ids, labels}.
  std::pair<Tensor, Tensor> mask_tokens(const Tensor& input_ids, const CollateContext& ctx) const;

 private:
  MLMCollatorOptions opt_;
  PadCollate pad_;
};

}  // namespace ember::data
