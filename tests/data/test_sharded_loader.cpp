// ShardedDataLoader: Accelerate-style batch sharding (split_batches, even_batches, drop_last),
// checked against hand-worked cases and against an independent model of the padded sample stream.
#include <algorithm>
#include <numeric>
#include <random>
#include <set>

#include "data/shard.h"
#include "test_util.h"

using namespace ember;

namespace {
using Batches = std::vector<std::vector<int64_t>>;

std::shared_ptr<data::TensorDataset> indices_dataset(int64_t n) {
  return std::make_shared<data::TensorDataset>(std::map<std::string, Tensor>{{"i", arange(n)}});
}

// What the loader really yields, read back from the tensors.
Batches collect(data::ShardedDataLoader& loader) {
  Batches out;
  for (auto& b : loader) out.push_back(b.at("i").to_vector<int64_t>());
  return out;
}

struct Case {
  int64_t n, batch_size;
  int R;
  bool split, even, drop_last;
  std::string str() const {
    return "n=" + std::to_string(n) + " batch_size=" + std::to_string(batch_size) + " R=" + std::to_string(R) +
           " split=" + std::to_string(split) + " even=" + std::to_string(even) + " drop_last=" +
           std::to_string(drop_last);
  }
};

// The model: all processes together walk the epoch's order, followed (with even_batches) by the same
// order again from its start; global step s covers the next total-batch-size samples of that stream,
// and process r's part of a step is its rank-th piece of it.
std::vector<Batches> model(const std::vector<int64_t>& order, const Case& c) {
  const int64_t n = int64_t(order.size()), b = c.batch_size, R = c.R;
  const bool pad = c.even && !c.drop_last && R > 1;
  const int64_t per_process = c.split && R > 1 ? b / R : b;  // samples per process per step
  const int64_t step = per_process * R;
  const int64_t steps = c.drop_last ? (c.split || R == 1 ? n / b : (n / b) / R) : (n + step - 1) / step;
  auto at = [&](int64_t i) { return order[size_t(i % n)]; };
  const int64_t stream_end = pad ? steps * step : std::min(n, steps * step);
  std::vector<Batches> out(static_cast<size_t>(R));
  for (int64_t s = 0; s < steps; ++s) {
    for (int64_t r = 0; r < R; ++r) {
      std::vector<int64_t> piece;
      for (int64_t i = s * step + r * per_process; i < std::min(stream_end, s * step + (r + 1) * per_process); ++i)
        piece.push_back(at(i));
      if (!piece.empty()) out[size_t(r)].push_back(piece);
    }
  }
  return out;
}

std::vector<data::ShardedDataLoader> make_shards(const data::DataLoader& base, const Case& c) {
  std::vector<data::ShardedDataLoader> shards;
  for (int r = 0; r < c.R; ++r)
    shards.emplace_back(base, data::ShardOptions{.num_processes = c.R, .process_index = r,
                                                 .split_batches = c.split, .even_batches = c.even});
  return shards;
}

// gather_for_metrics: every step's batches in rank order, the last step cut to remainder().
std::vector<int64_t> gather_and_trim(const std::vector<Batches>& per_rank, int64_t remainder) {
  size_t steps = 0;
  for (auto& b : per_rank) steps = std::max(steps, b.size());
  std::vector<int64_t> all;
  for (size_t s = 0; s < steps; ++s) {
    std::vector<int64_t> gathered;
    for (auto& b : per_rank)
      if (s < b.size()) gathered.insert(gathered.end(), b[s].begin(), b[s].end());
    if (s + 1 == steps && remainder > 0) gathered.resize(size_t(remainder));
    all.insert(all.end(), gathered.begin(), gathered.end());
  }
  return all;
}

std::vector<Batches> run_all(std::vector<data::ShardedDataLoader>& shards) {
  std::vector<Batches> out;
  for (auto& s : shards) out.push_back(collect(s));
  return out;
}
}  // namespace

TEST(ShardedDataLoader, HandWorkedWholeBatches) {
  auto ds = indices_dataset(10);
  data::DataLoader loader(ds, {.batch_size = 4});
  // even_batches: the last round wraps around to the first samples.
  auto even = make_shards(loader, {10, 4, 2, false, true, false});
  EXPECT_EQ(collect(even[0]), (Batches{{0, 1, 2, 3}, {8, 9, 0, 1}}));
  EXPECT_EQ(collect(even[1]), (Batches{{4, 5, 6, 7}, {2, 3, 4, 5}}));
  EXPECT_EQ(even[0].remainder(), 2);
  EXPECT_EQ(even[1].padding_samples(), 6);
  EXPECT_EQ(even[0].total_batch_size(), 8);
  EXPECT_EQ(even[1].total_dataset_length(), 10);
  // Uneven: rank 1 runs one step fewer and rank 0's last batch is short.
  auto uneven = make_shards(loader, {10, 4, 2, false, false, false});
  EXPECT_EQ(collect(uneven[0]), (Batches{{0, 1, 2, 3}, {8, 9}}));
  EXPECT_EQ(collect(uneven[1]), (Batches{{4, 5, 6, 7}}));
  EXPECT_EQ(uneven[0].size(), 2);
  EXPECT_EQ(uneven[1].size(), 1);
  EXPECT_EQ(uneven[0].padding_samples(), 0);
  // drop_last (from the loader, or overridden in the shard options).
  data::DataLoader dropping(ds, {.batch_size = 3, .drop_last = true});
  auto dl = make_shards(dropping, {10, 3, 3, false, true, true});
  EXPECT_EQ(collect(dl[0]), (Batches{{0, 1, 2}}));
  EXPECT_EQ(collect(dl[1]), (Batches{{3, 4, 5}}));
  EXPECT_EQ(collect(dl[2]), (Batches{{6, 7, 8}}));
  EXPECT_EQ(dl[2].remainder(), 0);
  data::ShardedDataLoader override_drop(loader, {.num_processes = 2, .process_index = 1, .drop_last = true});
  EXPECT_TRUE(override_drop.drop_last());
  EXPECT_EQ(collect(override_drop), (Batches{{4, 5, 6, 7}}));
  // Fewer samples than one global step: the order repeats as often as needed.
  auto tiny_ds = indices_dataset(3);
  data::DataLoader tiny(tiny_ds, {.batch_size = 2});
  auto t = make_shards(tiny, {3, 2, 4, false, true, false});
  EXPECT_EQ(collect(t[0]), (Batches{{0, 1}}));
  EXPECT_EQ(collect(t[1]), (Batches{{2, 0}}));
  EXPECT_EQ(collect(t[2]), (Batches{{1, 2}}));
  EXPECT_EQ(collect(t[3]), (Batches{{0, 1}}));
  EXPECT_EQ(t[0].remainder(), 3);
  EXPECT_EQ(t[0].padding_samples(), 5);
}

TEST(ShardedDataLoader, HandWorkedSplitBatches) {
  auto ds = indices_dataset(10);
  data::DataLoader loader(ds, {.batch_size = 4});
  auto even = make_shards(loader, {10, 4, 2, true, true, false});
  EXPECT_EQ(collect(even[0]), (Batches{{0, 1}, {4, 5}, {8, 9}}));
  EXPECT_EQ(collect(even[1]), (Batches{{2, 3}, {6, 7}, {0, 1}}));
  EXPECT_EQ(even[1].batch_size(), 2);
  EXPECT_EQ(even[1].total_batch_size(), 4);
  EXPECT_EQ(even[1].remainder(), 2);
  EXPECT_EQ(even[1].padding_samples(), 2);

  auto ds9 = indices_dataset(9);
  data::DataLoader loader9(ds9, {.batch_size = 4});
  auto uneven = make_shards(loader9, {9, 4, 2, true, false, false});
  EXPECT_EQ(collect(uneven[0]), (Batches{{0, 1}, {4, 5}, {8}}));
  EXPECT_EQ(collect(uneven[1]), (Batches{{2, 3}, {6, 7}}));

  auto ds7 = indices_dataset(7);
  data::DataLoader loader7(ds7, {.batch_size = 6});
  auto three = make_shards(loader7, {7, 6, 3, true, true, false});
  EXPECT_EQ(collect(three[0]), (Batches{{0, 1}, {6, 0}}));
  EXPECT_EQ(collect(three[1]), (Batches{{2, 3}, {1, 2}}));
  EXPECT_EQ(collect(three[2]), (Batches{{4, 5}, {3, 4}}));
}

TEST(ShardedDataLoader, MatchesTheStreamModelOnRandomCases) {
  std::mt19937 gen(1234);
  int checked = 0;
  for (int trial = 0; trial < 400; ++trial) {
    Case c;
    c.R = int(gen() % 4) + 1;
    c.split = gen() % 2;
    c.even = gen() % 2;
    c.drop_last = gen() % 3 == 0;
    c.batch_size = int64_t(gen() % 5) + 1;
    if (c.split) c.batch_size *= c.R;
    c.n = int64_t(gen() % 40);
    const bool shuffle = gen() % 2;
    SCOPED_TRACE(c.str() + " shuffle=" + std::to_string(shuffle));
    auto ds = indices_dataset(c.n);
    data::DataLoader loader(ds, {.batch_size = c.batch_size, .shuffle = shuffle, .drop_last = c.drop_last,
                                 .seed = uint64_t(trial)});
    loader.set_epoch(trial % 3);
    auto shards = make_shards(loader, c);
    auto order = loader.sampler().indices(trial % 3);
    auto got = run_all(shards);
    auto expected = model(order, c);
    ASSERT_EQ(got, expected);
    size_t steps = 0;
    for (int r = 0; r < c.R; ++r) {
      EXPECT_EQ(shards[size_t(r)].size(), int64_t(got[size_t(r)].size()));
      EXPECT_EQ(shards[size_t(r)].batch_indices(trial % 3), got[size_t(r)]);
      steps = std::max(steps, got[size_t(r)].size());
    }
    // even_batches: same step count and full batches everywhere.
    if (c.even && c.R > 1) {
      for (int r = 0; r < c.R; ++r) {
        EXPECT_EQ(got[size_t(r)].size(), got[0].size());
        for (auto& b : got[size_t(r)]) EXPECT_EQ(int64_t(b.size()), shards[0].batch_size());
      }
    }
    // Gathering rank-major and trimming to remainder() gives back the epoch's order exactly.
    const int64_t rem = shards[0].remainder();
    auto gathered = gather_and_trim(got, rem);
    if (c.drop_last) {
      const int64_t kept = int64_t(steps) * shards[0].total_batch_size();
      EXPECT_EQ(rem, 0);
      EXPECT_EQ(gathered, std::vector<int64_t>(order.begin(), order.begin() + kept));
    } else {
      EXPECT_EQ(gathered, order);
      int64_t total = 0;
      for (auto& b : got)
        for (auto& x : b) total += int64_t(x.size());
      EXPECT_EQ(shards[0].padding_samples(), total - c.n);
    }
    ++checked;
  }
  EXPECT_EQ(checked, 400);
}

TEST(ShardedDataLoader, OneProcessIsThePlainLoader) {
  auto ds = indices_dataset(11);
  for (bool even : {false, true}) {
    data::DataLoader loader(ds, {.batch_size = 4, .shuffle = true, .seed = 5});
    data::ShardedDataLoader one(loader, {.num_processes = 1, .process_index = 0, .even_batches = even});
    Batches plain;
    for (auto& b : loader) plain.push_back(b.at("i").to_vector<int64_t>());
    EXPECT_EQ(collect(one), plain);
    EXPECT_EQ(one.size(), 3);
    EXPECT_EQ(one.remainder(), 3);  // the short last batch is all real
    EXPECT_EQ(one.padding_samples(), 0);
  }
}

TEST(ShardedDataLoader, EndOfDataloaderFlagsTheLastBatch) {
  auto ds = indices_dataset(13);
  data::DataLoader loader(ds, {.batch_size = 2, .num_workers = 2});
  for (int r = 0; r < 3; ++r) {
    data::ShardedDataLoader shard(loader, {.num_processes = 3, .process_index = r});
    EXPECT_FALSE(shard.end_of_dataloader());
    std::vector<bool> flags;
    for (auto& b : shard) {
      (void)b;
      flags.push_back(shard.end_of_dataloader());
    }
    ASSERT_EQ(flags.size(), 3u);
    EXPECT_EQ(flags, (std::vector<bool>{false, false, true}));
    EXPECT_EQ(shard.remainder(), 1);
    EXPECT_EQ(shard.padding_samples(), 5);
  }
}

TEST(ShardedDataLoader, WorkersKeepTheShardOrder) {
  auto ds = indices_dataset(57);
  data::DataLoader serial(ds, {.batch_size = 3, .shuffle = true, .seed = 8});
  data::DataLoader threaded(ds, {.batch_size = 3, .shuffle = true, .num_workers = 3, .prefetch_factor = 2, .seed = 8});
  for (int r = 0; r < 4; ++r) {
    data::ShardOptions o{.num_processes = 4, .process_index = r};
    data::ShardedDataLoader a(serial, o), b(threaded, o);
    auto expect = a.batch_indices(0);
    EXPECT_EQ(collect(a), expect);
    EXPECT_EQ(collect(b), expect);
  }
}

TEST(ShardedDataLoader, SkipFirstBatchesResumesMidEpoch) {
  auto ds = indices_dataset(30);
  data::DataLoader loader(ds, {.batch_size = 4, .shuffle = true, .seed = 2});
  loader.set_epoch(4);
  for (bool split : {false, true}) {
    data::ShardedDataLoader shard(loader, {.num_processes = 2, .process_index = 1, .split_batches = split});
    EXPECT_EQ(shard.epoch(), 4);
    auto full = collect(shard);
    ASSERT_EQ(int64_t(full.size()), shard.size());
    shard.skip_first_batches(2);
    std::vector<bool> flags;
    Batches rest;
    for (auto& b : shard) {
      rest.push_back(b.at("i").to_vector<int64_t>());
      flags.push_back(shard.end_of_dataloader());
    }
    EXPECT_EQ(rest, Batches(full.begin() + 2, full.end()));
    EXPECT_TRUE(flags.back());
    EXPECT_EQ(collect(shard), full);  // the skip applies to one pass only
    shard.skip_first_batches(100);
    EXPECT_TRUE(collect(shard).empty());
  }
  data::ShardedDataLoader shard(loader, {.num_processes = 2, .process_index = 0});
  EXPECT_EMBER_ERROR(shard.skip_first_batches(-1), "skip_first_batches", "-1");
}

TEST(ShardedDataLoader, SetEpochReshufflesTheSameWayOnEveryRank) {
  const int64_t n = 37;
  auto ds = indices_dataset(n);
  data::DataLoader loader(ds, {.batch_size = 3, .shuffle = true, .seed = 21});
  auto shards = make_shards(loader, {n, 3, 3, false, true, false});
  std::vector<std::vector<int64_t>> epochs;
  for (int64_t epoch : {0, 1, 0}) {
    for (auto& s : shards) s.set_epoch(epoch);
    auto gathered = gather_and_trim(run_all(shards), shards[0].remainder());
    EXPECT_EQ(gathered, data::seeded_permutation(n, 21, epoch));
    epochs.push_back(gathered);
  }
  EXPECT_NE(epochs[0], epochs[1]);
  EXPECT_EQ(epochs[0], epochs[2]);
}

TEST(ShardedDataLoader, CollateSeesDistinctBatchIdsPerRank) {
  auto ds = indices_dataset(20);
  std::vector<int64_t> ids;
  data::DataLoaderOptions opt{.batch_size = 2};
  opt.collate = [&ids](const std::vector<data::Example>& e, const data::CollateContext& ctx) {
    ids.push_back(ctx.batch_index);
    return data::stack_collate(e, ctx);
  };
  data::DataLoader loader(ds, opt);
  for (int r = 0; r < 3; ++r) {
    data::ShardedDataLoader shard(loader, {.num_processes = 3, .process_index = r});
    collect(shard);
  }
  // Rank r's k-th batch is global step k: id k * 3 + r, as in the unsharded numbering.
  EXPECT_EQ(ids, (std::vector<int64_t>{0, 3, 6, 9, 1, 4, 7, 10, 2, 5, 8, 11}));
}

TEST(ShardedDataLoader, RejectsBadOptions) {
  auto ds = indices_dataset(10);
  data::DataLoader loader(ds, {.batch_size = 5});
  EXPECT_EMBER_ERROR(data::ShardedDataLoader(loader, {.num_processes = 2, .process_index = 2}), "ShardedDataLoader",
                     "process_index 2", "num_processes 2");
  EXPECT_EMBER_ERROR(data::ShardedDataLoader(loader, {.num_processes = 2, .process_index = -1}), "process_index -1");
  EXPECT_EMBER_ERROR(data::ShardedDataLoader(loader, {.num_processes = 0, .process_index = 0}), "num_processes",
                     "got 0");
  EXPECT_EMBER_ERROR(
      data::ShardedDataLoader(loader, {.num_processes = 2, .process_index = 0, .split_batches = true}),
      "split_batches", "batch_size 5", "num_processes 2");
}
