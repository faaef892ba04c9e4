#include "data/length_grouped_sampler.h"

#include <algorithm>

#include "core/error.h"

namespace ember::data {

LengthGroupedSampler::LengthGroupedSampler(std::vector<int64_t> lengths, int64_t batch_size, uint64_t seed,
                                           int64_t group_batches)
    : lengths_(std::move(lengths)), batch_size_(batch_size), seed_(seed), group_batches_(group_batches) {
  EMBER_CHECK(batch_size_ >= 1, "LengthGroupedSampler: batch_size must be at least 1, got ", batch_size_);
  EMBER_CHECK(group_batches_ >= 1, "LengthGroupedSampler: group_batches must be at least 1, got ", group_batches_);
}

std::vector<int64_t> LengthGroupedSampler::indices(int64_t epoch) const {
  std::vector<int64_t> order = seeded_permutation(size(), seed_, epoch);
  const int64_t group = batch_size_ * group_batches_;
  for (int64_t lo = 0; lo < size(); lo += group) {
    const int64_t hi = std::min(size(), lo + group);
    // Stable, so equal lengths keep their shuffled order.
    std::stable_sort(order.begin() + lo, order.begin() + hi,
                     [&](int64_t a, int64_t b) { return lengths_[size_t(a)] > lengths_[size_t(b)]; });
  }
  return order;
}

}  // namespace ember::data
