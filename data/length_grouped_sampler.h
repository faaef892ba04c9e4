// LengthGroupedSampler: a shuffle that keeps examples of similar length together, so that
// dynamically padded batches carry little padding (Hugging Face's group_by_length).
//
// Each epoch: a seeded permutation of all examples (as RandomSampler), cut into "mega-batches"
// of batch_size * group_batches examples, each sorted by length, longest first. Consecutive
// batch_size slices of that order are then batches of near-equal length, and the batches still
// come in a random order of mega-batches. group_batches = 1 sorts within each batch only.
// The mega-batch holding the longest example goes first (as Hugging Face puts the longest
// example first): the epoch's largest batch runs at its first step, so running out of memory
// shows at once, and a caching allocator reaches its high-water mark there instead of growing
// whenever a longer batch happens to come.
//
// Without a seed, one is drawn from Ember's generator when the sampler is built (draw_seed), so
// manual_seed / Accelerator::set_seed decide the order.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "data/sampler.h"

namespace ember::data {

class LengthGroupedSampler : public Sampler {
 public:
  LengthGroupedSampler(std::vector<int64_t> lengths, int64_t batch_size, std::optional<uint64_t> seed = std::nullopt,
                       int64_t group_batches = 50);
  std::vector<int64_t> indices(int64_t epoch) const override;
  int64_t size() const override { return int64_t(lengths_.size()); }
  std::optional<uint64_t> seed() const override { return seed_; }
  bool seed_was_drawn() const override { return drawn_; }
  std::shared_ptr<const Sampler> with_seed(uint64_t seed) const override;

 private:
  std::vector<int64_t> lengths_;
  int64_t batch_size_;
  uint64_t seed_;
  bool drawn_;
  int64_t group_batches_;
};

}  // namespace ember::data
