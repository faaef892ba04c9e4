#include "data/distributed_sampler.h"

#include <numeric>

#include "core/error.h"

namespace ember::data {

DistributedSampler::DistributedSampler(int64_t n, int num_replicas, int rank, bool shuffle, uint64_t seed,
                                       bool drop_last)
    : n_(n), num_replicas_(num_replicas), rank_(rank), shuffle_(shuffle), seed_(seed), drop_last_(drop_last) {
  EMBER_CHECK(n >= 0, "DistributedSampler: dataset size must be >= 0, got ", n);
  EMBER_CHECK(num_replicas >= 1, "DistributedSampler: num_replicas must be >= 1, got ", num_replicas);
  EMBER_CHECK(rank >= 0 && rank < num_replicas, "DistributedSampler: rank ", rank,
              " is out of range for num_replicas ", num_replicas, " (expected 0 <= rank < ", num_replicas, ")");
  const int64_t r = num_replicas;
  num_samples_ = drop_last ? n / r : (n + r - 1) / r;
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch) const {
  std::vector<int64_t> order;
  if (shuffle_) {
    order = seeded_permutation(n_, seed_, epoch);
  } else {
    order.resize(size_t(n_));
    std::iota(order.begin(), order.end(), 0);
  }
  const int64_t total = total_size();
  // Wrap around from the start of the epoch's order (repeatedly when there are fewer indices
  // than ranks) so every rank gets the same count.
  std::vector<int64_t> mine;
  mine.reserve(size_t(num_samples_));
  for (int64_t i = rank_; i < total; i += num_replicas_) mine.push_back(order[size_t(i % n_)]);
  return mine;
}

}  // namespace ember::data
