#include "data/length_grouped_sampler.h"

#include <algorithm>

#include "core/error.h"

namespace ember::data {

LengthGroupedSampler::LengthGroupedSampler(std::vector<int64_t> lengths, int64_t batch_size,
                                           std::optional<uint64_t> seed, int64_t group_batches)
    : lengths_(std::move(lengths)), batch_size_(batch_size), seed_(0), drawn_(!seed), group_batches_(group_batches) {
  EMBER_CHECK(batch_size_ >= 1, "LengthGroupedSampler: batch_size must be at least 1, got ", batch_size_);
  EMBER_CHECK(group_batches_ >= 1, "LengthGroupedSampler: group_batches must be at least 1, got ", group_batches_);
  // Drawn after the checks: a refused sampler leaves the generator as it was.
  seed_ = seed ? *seed : draw_seed();
}

std::shared_ptr<const Sampler> LengthGroupedSampler::with_seed(uint64_t seed) const {
  auto copy = std::make_shared<LengthGroupedSampler>(*this);
  copy->seed_ = seed;
  return copy;
}

std::vector<int64_t> LengthGroupedSampler::indices(int64_t epoch) const {
  std::vector<int64_t> order = seeded_permutation(size(), seed_, epoch);
  const int64_t group = batch_size_ * group_batches_;
  const auto longer = [&](int64_t a, int64_t b) { return lengths_[size_t(a)] > lengths_[size_t(b)]; };
  int64_t longest_group = 0;
  for (int64_t lo = 0; lo < size(); lo += group) {
    const int64_t hi = std::min(size(), lo + group);
    // Stable, so equal lengths keep their shuffled order.
    std::stable_sort(order.begin() + lo, order.begin() + hi, longer);
    if (longer(order[size_t(lo)], order[size_t(longest_group)])) longest_group = lo;
  }
  // The mega-batch that starts with the longest example moves to the front; the others keep
  // their order (a rotation, so a shorter last mega-batch stays whole).
  if (longest_group > 0) {
    const int64_t hi = std::min(size(), longest_group + group);
    std::rotate(order.begin(), order.begin() + longest_group, order.begin() + hi);
  }
  return order;
}

}  // namespace ember::data
