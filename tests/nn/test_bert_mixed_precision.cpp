// A BERT-mini trained with masked LM for 200 steps under bf16 autocast follows the loss curve
// of the same run in f32 (same initial weights, batches and dropout streams). The task is
// learnable in that budget (each position has a typical token), so both curves fall far, and
// a bf16 run that failed to train or drifted would leave the band.
#include <cmath>
#include <cstdio>
#include <random>

#include "test_util.h"

using namespace ember;

namespace {
constexpr int64_t kVocab = 68, kBatch = 8, kSeq = 32, kSteps = 200, kWindow = 20;

// Token at position i: with probability 0.8 the position's own token (7 i + 3) mod 64, else
// uniform; shifted past the special ids 0..3. Also returns which positions are masked (15%).
Tensor position_batch(std::mt19937_64& gen, Tensor& scored) {
  std::vector<int64_t> ids(size_t(kBatch * kSeq));
  std::vector<uint8_t> masked(ids.size());
  std::uniform_int_distribution<int64_t> any(0, kVocab - 5);
  std::bernoulli_distribution typical(0.8), pick(0.15);
  for (auto& m : masked) m = pick(gen) ? 1 : 0;
  for (int64_t b = 0; b < kBatch; ++b)
    for (int64_t i = 0; i < kSeq; ++i) ids[size_t(b * kSeq + i)] = 4 + (typical(gen) ? (7 * i + 3) % 64 : any(gen));
  std::vector<int64_t> as_int(masked.begin(), masked.end());
  scored = ne(from_vector(as_int, {kBatch, kSeq}), 0.0);
  return from_vector(ids, {kBatch, kSeq});
}

std::vector<double> train(bool bf16) {
  manual_seed(1234);
  nn::BertConfig cfg = nn::BertConfig::mini(kVocab);
  cfg.max_position_embeddings = kSeq;
  nn::BertForMaskedLM model(cfg);
  model.train();
  optim::AdamW opt(model.parameters(), {.lr = 1e-3});
  std::mt19937_64 data_gen(99);
  std::vector<double> losses;
  for (int64_t step = 0; step < kSteps; ++step) {
    Tensor scored;
    Tensor ids = position_batch(data_gen, scored);
    Tensor labels = where(scored, ids, full({kBatch, kSeq}, -100.0, {DType::i64}));
    Tensor inputs = where(scored, full({kBatch, kSeq}, 3.0, {DType::i64}), ids);  // 3 = [MASK]
    Tensor loss;
    {
      AutocastGuard autocast(DeviceType::CPU, DType::bf16, bf16);
      loss = model.forward(inputs, Tensor(), Tensor(), labels).loss;
    }
    EXPECT_EQ(loss.dtype(), DType::f32);
    loss.backward();
    opt.step();
    opt.zero_grad();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

double window_mean(const std::vector<double>& v, size_t start) {
  double s = 0;
  for (size_t i = start; i < start + size_t(kWindow); ++i) s += v[i];
  return s / double(kWindow);
}
}  // namespace

TEST(BertMixedPrecision, Bf16FollowsTheF32LossCurveFor200Steps) {
  const std::vector<double> f32 = train(false), bf16 = train(true);
  ASSERT_EQ(f32.size(), size_t(kSteps));
  // Band: per 20-step window, the bf16 mean loss within 0.05 + 5% of the f32 mean loss.
  for (size_t w = 0; w + size_t(kWindow) <= f32.size(); w += size_t(kWindow)) {
    const double a = window_mean(f32, w), b = window_mean(bf16, w);
    std::printf("steps %3zu-%3zu  f32 %.4f  bf16 %.4f\n", w, w + size_t(kWindow) - 1, a, b);
    EXPECT_TRUE(std::isfinite(b));
    EXPECT_LE(std::abs(a - b), 0.05 + 0.05 * a) << "window starting at step " << w;
  }
  // Both really trained: from about ln 68 = 4.2 at the first step to near the task's entropy
  // (about 1.3) in the last window.
  EXPECT_GT(f32[0], 3.8);
  EXPECT_LT(window_mean(f32, size_t(kSteps - kWindow)), 0.4 * f32[0]);
  EXPECT_LT(window_mean(bf16, size_t(kSteps - kWindow)), 0.4 * f32[0]);
}

TEST(BertMixedPrecision, LogitsFollowTheAutocastTypeUnlessConvertedToF32) {
  manual_seed(7);
  nn::BertConfig cfg = nn::BertConfig::tiny(kVocab);
  cfg.max_position_embeddings = kSeq;
  nn::BertForSequenceClassification model(cfg);
  model.eval();  // no dropout: both forwards compute the same logits
  Tensor ids = randint(4, kVocab, {2, 8});
  Tensor labels = randint(0, 2, {2});
  AutocastGuard autocast(DeviceType::CPU, DType::bf16);
  nn::ModelOutput out = model.forward(ids, Tensor(), Tensor(), labels);
  EXPECT_EQ(out.logits.dtype(), DType::bf16);
  EXPECT_EQ(out.loss.dtype(), DType::f32);
  // What Accelerator::prepare sets under mixed precision (Accelerate's convert_outputs_to_fp32).
  model.set_convert_outputs_to_f32(true);
  nn::ModelOutput converted = model.forward(ids, Tensor(), Tensor(), labels);
  EXPECT_EQ(converted.logits.dtype(), DType::f32);
  EXPECT_TRUE(ember::testing::all_close(converted.logits, out.logits.to(DType::f32), 0.0, 0.0));
  // The MLM head too.
  nn::BertForMaskedLM mlm(cfg);
  mlm.set_convert_outputs_to_f32(true);
  EXPECT_EQ(mlm.forward(ids).logits.dtype(), DType::f32);
}
