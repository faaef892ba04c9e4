// DistributedSampler: per-rank shares that are disjoint, cover the dataset (with PyTorch's
// wrap-around padding or drop_last truncation) and shuffle identically on every rank.
#include <algorithm>
#include <numeric>
#include <set>

#include "data/dataloader.h"
#include "data/distributed_sampler.h"
#include "test_util.h"

using namespace ember;

namespace {
std::vector<std::vector<int64_t>> shares(int64_t n, int R, bool shuffle, uint64_t seed, bool drop_last,
                                         int64_t epoch) {
  std::vector<std::vector<int64_t>> out;
  for (int r = 0; r < R; ++r) out.push_back(data::DistributedSampler(n, R, r, shuffle, seed, drop_last).indices(epoch));
  return out;
}
// Rank-interleaved union: element i of the padded epoch order lives at rank i % R, position i / R.
std::vector<int64_t> interleave(const std::vector<std::vector<int64_t>>& s) {
  std::vector<int64_t> all;
  for (size_t k = 0; k < s[0].size(); ++k)
    for (const auto& share : s) all.push_back(share[k]);
  return all;
}
}  // namespace

TEST(DistributedSampler, HandWorkedSequentialShares) {
  // 10 samples over 3 ranks: padded to 12 by wrapping to the start.
  auto s = shares(10, 3, false, 0, false, 0);
  EXPECT_EQ(s[0], (std::vector<int64_t>{0, 3, 6, 9}));
  EXPECT_EQ(s[1], (std::vector<int64_t>{1, 4, 7, 0}));
  EXPECT_EQ(s[2], (std::vector<int64_t>{2, 5, 8, 1}));
  // drop_last truncates to 9.
  auto d = shares(10, 3, false, 0, true, 0);
  EXPECT_EQ(d[0], (std::vector<int64_t>{0, 3, 6}));
  EXPECT_EQ(d[1], (std::vector<int64_t>{1, 4, 7}));
  EXPECT_EQ(d[2], (std::vector<int64_t>{2, 5, 8}));
  // Fewer samples than ranks: the order repeats as often as needed.
  auto tiny = shares(2, 5, false, 0, false, 0);
  EXPECT_EQ(interleave(tiny), (std::vector<int64_t>{0, 1, 0, 1, 0}));
  EXPECT_TRUE(shares(2, 5, false, 0, true, 0)[4].empty());
  EXPECT_TRUE(shares(0, 3, true, 0, false, 0)[1].empty());
}

TEST(DistributedSampler, SharesAreDisjointAndCoverTheDataset) {
  for (int64_t n : {0, 1, 7, 12, 13, 64, 101}) {
    for (int R : {1, 2, 3, 4, 5}) {
      for (bool drop_last : {false, true}) {
        for (bool shuffle : {false, true}) {
          SCOPED_TRACE("n=" + std::to_string(n) + " R=" + std::to_string(R) + " drop_last=" +
                       std::to_string(drop_last) + " shuffle=" + std::to_string(shuffle));
          auto s = shares(n, R, shuffle, 5, drop_last, 3);
          const int64_t per = drop_last ? n / R : (n + R - 1) / R;
          for (int r = 0; r < R; ++r) {
            EXPECT_EQ(int64_t(s[size_t(r)].size()), per);
            EXPECT_EQ(data::DistributedSampler(n, R, r, shuffle, 5, drop_last).size(), per);
          }
          // The interleaved shares are the epoch's order, then wrap-around padding from its start.
          std::vector<int64_t> order = shuffle ? data::seeded_permutation(n, 5, 3) : [&] {
            std::vector<int64_t> v(static_cast<size_t>(n));
            std::iota(v.begin(), v.end(), 0);
            return v;
          }();
          std::vector<int64_t> expected;
          for (int64_t i = 0; i < per * R; ++i) expected.push_back(order[size_t(i % n)]);
          EXPECT_EQ(interleave(s), expected);
          std::set<int64_t> seen;
          for (auto& share : s) seen.insert(share.begin(), share.end());
          if (drop_last) {
            EXPECT_EQ(int64_t(seen.size()), per * R);  // disjoint: no index twice
          } else {
            EXPECT_EQ(int64_t(seen.size()), n);  // every index at least once
            if (n > 0) {
              EXPECT_EQ(*seen.rbegin(), n - 1);
            }
          }
          if (n % R == 0) {
            EXPECT_EQ(int64_t(seen.size()), n);  // exact partition
          }
        }
      }
    }
  }
}

TEST(DistributedSampler, SameShuffleOnEveryRankNewShuffleEachEpoch) {
  const int64_t n = 40;
  const int R = 4;
  auto e0 = interleave(shares(n, R, true, 9, false, 0));
  auto e1 = interleave(shares(n, R, true, 9, false, 1));
  EXPECT_EQ(e0, data::seeded_permutation(n, 9, 0));
  EXPECT_EQ(e1, data::seeded_permutation(n, 9, 1));
  EXPECT_NE(e0, e1);
  EXPECT_EQ(interleave(shares(n, R, true, 9, false, 0)), e0);  // reproducible
  EXPECT_NE(interleave(shares(n, R, true, 10, false, 0)), e0);  // the seed matters
  std::vector<int64_t> sorted = e1;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(sorted[size_t(i)], i);
}

TEST(DistributedSampler, DrivesADataLoader) {
  auto ds = std::make_shared<data::TensorDataset>(std::map<std::string, Tensor>{{"x", arange(11)}});
  std::vector<int64_t> all;
  for (int r = 0; r < 2; ++r) {
    auto sampler = std::make_shared<data::DistributedSampler>(11, 2, r, true, 3);
    data::DataLoader loader(ds, sampler, {.batch_size = 4});
    loader.set_epoch(2);
    EXPECT_EQ(loader.size(), 2);
    std::vector<int64_t> seen;
    for (auto& b : loader) {
      auto v = b.at("x").to_vector<int64_t>();
      seen.insert(seen.end(), v.begin(), v.end());
    }
    EXPECT_EQ(seen, sampler->indices(2));
    all.insert(all.end(), seen.begin(), seen.end());
  }
  std::set<int64_t> distinct(all.begin(), all.end());
  EXPECT_EQ(all.size(), 12u);
  EXPECT_EQ(distinct.size(), 11u);
}

TEST(DistributedSampler, RejectsBadRanks) {
  EXPECT_EMBER_ERROR(data::DistributedSampler(10, 2, 2), "DistributedSampler", "rank 2", "num_replicas 2");
  EXPECT_EMBER_ERROR(data::DistributedSampler(10, 2, -1), "DistributedSampler", "rank -1");
  EXPECT_EMBER_ERROR(data::DistributedSampler(10, 0, 0), "DistributedSampler", "num_replicas", "got 0");
  EXPECT_EMBER_ERROR(data::DistributedSampler(-1, 2, 0), "DistributedSampler", "dataset size");
}
