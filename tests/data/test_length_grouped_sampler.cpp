#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "data/length_grouped_sampler.h"
#include "test_util.h"

namespace ember::data {
namespace {

std::vector<int64_t> random_lengths(int64_t n) {
  std::vector<int64_t> lengths(static_cast<size_t>(n));
  for (auto& l : lengths) l = testing::uniform_int(3, 66);
  return lengths;
}

TEST(LengthGroupedSampler, EveryIndexOncePerEpoch) {
  const auto lengths = random_lengths(1003);
  LengthGroupedSampler s(lengths, 32, 7, 10);
  for (int64_t epoch : {0, 1, 5}) {
    auto idx = s.indices(epoch);
    ASSERT_EQ(idx.size(), lengths.size());
    std::sort(idx.begin(), idx.end());
    for (int64_t i = 0; i < int64_t(idx.size()); ++i) ASSERT_EQ(idx[size_t(i)], i);
  }
}

TEST(LengthGroupedSampler, MegaBatchesAreSortedLongestFirstAndEpochsDiffer) {
  const auto lengths = random_lengths(1000);
  const int64_t batch = 16, groups = 5, mega = batch * groups;
  LengthGroupedSampler s(lengths, batch, 3, groups);
  const auto e0 = s.indices(0), e1 = s.indices(1);
  EXPECT_NE(e0, e1);
  EXPECT_EQ(e0, LengthGroupedSampler(lengths, batch, 3, groups).indices(0));  // seeded
  // Sorted runs, one per mega-batch: the order rises in length only where a mega-batch starts.
  int64_t rises = 0;
  for (int64_t i = 1; i < 1000; ++i) rises += lengths[size_t(e0[size_t(i - 1)])] < lengths[size_t(e0[size_t(i)])];
  EXPECT_LE(rises, (1000 + mega - 1) / mega - 1);
  // The epoch opens with the longest example, followed by the rest of its mega-batch.
  for (int64_t i = 1; i < mega; ++i)
    ASSERT_GE(lengths[size_t(e0[size_t(i - 1)])], lengths[size_t(e0[size_t(i)])]) << "at " << i;
}

TEST(LengthGroupedSampler, EveryEpochOpensWithItsLongestBatch) {
  // 100 examples, mega-batches of 80 and a short last one of 20; one example (37) is longer
  // than all others. Over 20 epochs the shuffle puts it in both mega-batches.
  std::vector<int64_t> lengths(100);
  for (auto& l : lengths) l = testing::uniform_int(3, 60);
  lengths[37] = 100;
  LengthGroupedSampler s(lengths, 16, 11, 5);
  int64_t epochs_from_the_short_mega_batch = 0;
  for (int64_t epoch = 0; epoch < 20; ++epoch) {
    const auto shuffled = seeded_permutation(100, 11, epoch);
    epochs_from_the_short_mega_batch += std::find(shuffled.begin(), shuffled.end(), 37) - shuffled.begin() >= 80;
    const auto order = s.indices(epoch);
    ASSERT_EQ(order[0], 37) << "epoch " << epoch;
    auto sorted = order;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t i = 0; i < 100; ++i) ASSERT_EQ(sorted[size_t(i)], i);
    // The moved mega-batch stays whole and sorted: one rise in length, where the other starts.
    int64_t rises = 0;
    for (int64_t i = 1; i < 100; ++i) rises += lengths[size_t(order[size_t(i - 1)])] < lengths[size_t(order[size_t(i)])];
    EXPECT_LE(rises, 1) << "epoch " << epoch;
  }
  EXPECT_GT(epochs_from_the_short_mega_batch, 0);
  EXPECT_LT(epochs_from_the_short_mega_batch, 20);
}


TEST(LengthGroupedSampler, CutsPaddingAgainstAPlainShuffle) {
  const auto lengths = random_lengths(4096);
  const int64_t batch = 32;
  auto padded_tokens = [&](const std::vector<int64_t>& order) {
    int64_t total = 0;
    for (size_t lo = 0; lo < order.size(); lo += batch) {
      int64_t longest = 0, count = 0;
      for (size_t i = lo; i < std::min(order.size(), lo + batch); ++i, ++count)
        longest = std::max(longest, lengths[size_t(order[i])]);
      total += longest * count;
    }
    return total;
  };
  const int64_t grouped = padded_tokens(LengthGroupedSampler(lengths, batch, 4).indices(0));
  const int64_t shuffled = padded_tokens(seeded_permutation(4096, 4, 0));
  const int64_t real = std::accumulate(lengths.begin(), lengths.end(), int64_t(0));
  EXPECT_LT(grouped, shuffled * 7 / 10);
  EXPECT_LT(grouped, real * 11 / 10);
}

TEST(LengthGroupedSampler, RejectsBadSizes) {
  EXPECT_EMBER_ERROR(LengthGroupedSampler({1, 2}, 0, 0), "LengthGroupedSampler", "batch_size");
  EXPECT_EMBER_ERROR(LengthGroupedSampler({1, 2}, 4, 0, 0), "group_batches");
}

}  // namespace
}  // namespace ember::data
