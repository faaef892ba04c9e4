// DataLoader ordering, shuffling, workers, collation and MLM masking.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <numeric>
#include <set>

#include "core/rng.h"
#include "data/dataloader.h"
#include "data/length_grouped_sampler.h"
#include "data/mlm_collator.h"
#include "test_util.h"

using namespace ember;

namespace {
std::shared_ptr<data::TensorDataset> numbers(int64_t n) {
  return std::make_shared<data::TensorDataset>(
      std::map<std::string, Tensor>{{"x", arange(n)}, {"y", arange(n) * 2}});
}
std::vector<int64_t> collect(data::DataLoader& loader) {
  std::vector<int64_t> seen;
  for (auto& b : loader) {
    auto v = b.at("x").to_vector<int64_t>();
    seen.insert(seen.end(), v.begin(), v.end());
  }
  return seen;
}
// A dataset whose examples take uneven time, to shake out ordering bugs in the workers.
class SlowDataset : public data::Dataset {
 public:
  explicit SlowDataset(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  data::Example get(int64_t i) const override {
    if (i % 7 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    if (i == fail_at) throw Error("SlowDataset: broken example " + std::to_string(i));
    return {{"x", scalar_tensor(double(i), {DType::i64})}};
  }
  int64_t fail_at = -1;

 private:
  int64_t n_;
};
}  // namespace

TEST(DataLoader, SequentialBatchesAndDropLast) {
  auto ds = numbers(10);
  data::DataLoader loader(ds, {.batch_size = 4});
  EXPECT_EQ(loader.size(), 3);
  std::vector<int64_t> sizes;
  for (auto& b : loader) {
    sizes.push_back(b.size());
    EXPECT_EQ((b.at("y") - b.at("x") * 2).abs().sum().item<int64_t>(), 0);
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 4, 2}));
  data::DataLoader dl(ds, {.batch_size = 4, .drop_last = true});
  EXPECT_EQ(dl.size(), 2);
  EXPECT_EQ(collect(dl).size(), 8u);
}

TEST(DataLoader, ShuffleWithoutASeedFollowsManualSeedAndAGivenSeedWins) {
  auto ds = numbers(40);
  auto order_after = [&](uint64_t seed, std::optional<uint64_t> loader_seed) {
    manual_seed(seed);
    data::DataLoader loader(ds, {.batch_size = 8, .shuffle = true, .seed = loader_seed});
    EXPECT_EQ(loader.sampler().seed_was_drawn(), !loader_seed);
    return collect(loader);
  };
  const auto one = order_after(1, std::nullopt);
  EXPECT_NE(one, order_after(2, std::nullopt));  // as torch.manual_seed changes a DataLoader's order
  EXPECT_EQ(one, order_after(1, std::nullopt));
  EXPECT_EQ(order_after(1, 5), order_after(2, 5));
  std::vector<int64_t> sorted = one;
  std::sort(sorted.begin(), sorted.end());
  data::DataLoader in_order(ds, {.batch_size = 8});
  EXPECT_EQ(sorted, collect(in_order));

  // Only a shuffling loader without a seed draws from the generator.
  manual_seed(4);
  const GeneratorState before = default_generator().get_state();
  data::DataLoader sequential(ds, {.batch_size = 8});
  data::DataLoader seeded(ds, {.batch_size = 8, .shuffle = true, .seed = 3});
  EXPECT_EQ(default_generator().get_state().offset, before.offset);
  EXPECT_FALSE(sequential.sampler().seed().has_value());
  EXPECT_EQ(seeded.sampler().seed(), std::optional<uint64_t>(3));
  data::DataLoader drawn(ds, {.batch_size = 8, .shuffle = true});
  EXPECT_GT(default_generator().get_state().offset, before.offset);
  // with_seed: the same sampler shuffling from another seed, still counted as drawn.
  auto reseeded = drawn.sampler().with_seed(3);
  ASSERT_NE(reseeded, nullptr);
  EXPECT_EQ(reseeded->indices(2), seeded.sampler().indices(2));
  EXPECT_TRUE(reseeded->seed_was_drawn());
  EXPECT_EQ(sequential.sampler().with_seed(3), nullptr);
}

TEST(DataLoader, LengthGroupedSamplerDrawsItsSeedWhenNoneIsGiven) {
  std::vector<int64_t> lengths(30);
  for (size_t i = 0; i < lengths.size(); ++i) lengths[i] = int64_t((i * 7) % 11);
  manual_seed(1);
  data::LengthGroupedSampler a(lengths, 4, std::nullopt, 2);
  manual_seed(2);
  data::LengthGroupedSampler b(lengths, 4, std::nullopt, 2);
  manual_seed(1);
  data::LengthGroupedSampler a_again(lengths, 4);
  EXPECT_TRUE(a.seed_was_drawn());
  EXPECT_NE(a.indices(0), b.indices(0));
  EXPECT_EQ(a.seed(), a_again.seed());
  data::LengthGroupedSampler given(lengths, 4, 9, 2);
  EXPECT_FALSE(given.seed_was_drawn());
  EXPECT_EQ(a.with_seed(9)->indices(1), given.indices(1));
  // A refused sampler leaves the generator alone.
  const uint64_t offset = default_generator().get_state().offset;
  EXPECT_EMBER_ERROR(data::LengthGroupedSampler(lengths, 0), "LengthGroupedSampler", "batch_size");
  EXPECT_EQ(default_generator().get_state().offset, offset);
}

TEST(DataLoader, ShuffleIsSeededAndChangesPerEpoch) {
  auto ds = numbers(50);
  data::DataLoader a(ds, {.batch_size = 8, .shuffle = true, .seed = 7});
  data::DataLoader b(ds, {.batch_size = 8, .shuffle = true, .seed = 7});
  auto e0 = collect(a);
  EXPECT_EQ(e0, collect(b));
  std::vector<int64_t> sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(sorted[size_t(i)], i);
  EXPECT_NE(e0, [] {
    std::vector<int64_t> v(50);
    std::iota(v.begin(), v.end(), 0);
    return v;
  }());
  a.set_epoch(1);
  EXPECT_NE(collect(a), e0);
  a.set_epoch(0);
  EXPECT_EQ(collect(a), e0);
}

TEST(DataLoader, WorkersKeepOrderAndMatchSerial) {
  auto ds = std::make_shared<SlowDataset>(60);
  data::DataLoader serial(ds, {.batch_size = 5, .shuffle = true, .seed = 3});
  data::DataLoader parallel(ds, {.batch_size = 5, .shuffle = true, .num_workers = 3, .prefetch_factor = 2, .seed = 3});
  EXPECT_EQ(collect(serial), collect(parallel));
  // stopping early joins the workers without hanging
  int n = 0;
  for (auto& b : parallel) {
    (void)b;
    if (++n == 2) break;
  }
  EXPECT_EQ(collect(parallel).size(), 60u);
}

TEST(DataLoader, WorkerErrorsReachTheCaller) {
  auto ds = std::make_shared<SlowDataset>(30);
  ds->fail_at = 17;
  data::DataLoader loader(ds, {.batch_size = 4, .num_workers = 2});
  EXPECT_EMBER_ERROR(collect(loader), "broken example 17");
  EXPECT_EMBER_ERROR(data::DataLoader(ds, {.batch_size = 0}), "batch_size");
}

TEST(DataLoader, SkipFirstBatchesResumesMidEpoch) {
  auto ds = numbers(20);
  data::DataLoader loader(ds, {.batch_size = 4, .shuffle = true, .seed = 1});
  auto full = collect(loader);
  loader.skip_first_batches(2);
  auto rest = collect(loader);
  EXPECT_EQ(rest, std::vector<int64_t>(full.begin() + 8, full.end()));
}

TEST(Collate, PadCollatePadsToTheLongest) {
  std::vector<data::Example> ex = {
      {{"input_ids", from_vector<int64_t>({5, 6, 7})}, {"labels", scalar_tensor(1, {DType::i64})}},
      {{"input_ids", from_vector<int64_t>({8})}, {"labels", scalar_tensor(0, {DType::i64})}}};
  data::PadCollate pad{{{"input_ids", 0.0}}};
  auto b = pad(ex);
  EXPECT_EQ(b.at("input_ids").shape(), (Shape{2, 3}));
  EXPECT_EQ(b.at("input_ids").to_vector<int64_t>(), (std::vector<int64_t>{5, 6, 7, 8, 0, 0}));
  EXPECT_EQ(b.at("labels").to_vector<int64_t>(), (std::vector<int64_t>{1, 0}));
  pad.pad_to_multiple_of = 4;
  EXPECT_EQ(pad(ex).at("input_ids").size(1), 4);
  EXPECT_EMBER_ERROR(data::stack_collate(ex), "stack_collate", "input_ids");
}

TEST(MLMCollator, MasksFifteenPercentEightyTenTen) {
  const int64_t vocab = 1000, n = 64, len = 128;
  std::vector<data::Example> ex;
  for (int64_t i = 0; i < n; ++i) {
    Tensor ids = randint(200, vocab, {len});
    ids.select(0, 0).fill_(101);  // [CLS] is never masked
    ex.push_back({{"input_ids", ids}, {"attention_mask", ones({len}, {DType::i64})}});
  }
  data::MLMCollator mlm({.vocab_size = vocab, .seed = 11});
  auto b = mlm(ex, {0, 0});
  auto orig = data::PadCollate{}(ex).at("input_ids").to_vector<int64_t>();
  auto ids = b.at("input_ids").to_vector<int64_t>();
  auto labels = b.at("labels").to_vector<int64_t>();
  int64_t chosen = 0, masked = 0, kept = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (labels[i] == -100) {
      EXPECT_EQ(ids[i], orig[i]);
      continue;
    }
    EXPECT_EQ(labels[i], orig[i]);
    EXPECT_NE(i % len, 0u);  // never the [CLS] position
    ++chosen;
    masked += ids[i] == 103;
    kept += ids[i] == orig[i];
  }
  const double total = double(n * (len - 1));
  EXPECT_NEAR(chosen / total, 0.15, 0.01);
  EXPECT_NEAR(double(masked) / chosen, 0.8, 0.03);
  EXPECT_NEAR(double(kept) / chosen, 0.1 + 0.1 / vocab, 0.03);  // a random token can equal the original
  // The same (seed, epoch, batch) gives the same masks; another batch index differs.
  EXPECT_EQ(mlm(ex, {0, 0}).at("labels").to_vector<int64_t>(), labels);
  EXPECT_NE(mlm(ex, {0, 1}).at("labels").to_vector<int64_t>(), labels);
}
