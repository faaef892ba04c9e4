// Samplers decide the order of examples in an epoch; BatchSampler groups them.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace ember::data {

class Sampler {
 public:
  virtual ~Sampler() = default;
  // The indices for `epoch`; the same epoch always gives the same order.
  virtual std::vector<int64_t> indices(int64_t epoch) const = 0;
  virtual int64_t size() const = 0;

  // Shuffling samplers: the seed their order is drawn from (nullopt for an order without one).
  virtual std::optional<uint64_t> seed() const { return std::nullopt; }
  // True when that seed was not given but drawn from Ember's generator (draw_seed), so that
  // manual_seed / Accelerator::set_seed decide the order, as torch.manual_seed does for a
  // PyTorch DataLoader. Accelerator::prepare then gives every process process 0's seed.
  virtual bool seed_was_drawn() const { return false; }
  // The same sampler shuffling from `seed` (nullptr for a sampler without a seed).
  virtual std::shared_ptr<const Sampler> with_seed(uint64_t /*seed*/) const { return nullptr; }
};

// A shuffle seed drawn from Ember's generator (one 64-bit draw, advancing it): what samplers
// without an explicit seed use.
uint64_t draw_seed();

class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t n) : n_(n) {}
  std::vector<int64_t> indices(int64_t epoch) const override;
  int64_t size() const override { return n_; }

 private:
  int64_t n_;
};

// A permutation drawn from (seed, epoch): reshuffled every epoch, reproducible everywhere.
// Without a seed, one is drawn from Ember's generator when the sampler is built.
class RandomSampler : public Sampler {
 public:
  explicit RandomSampler(int64_t n, std::optional<uint64_t> seed = std::nullopt)
      : n_(n), seed_(seed ? *seed : draw_seed()), drawn_(!seed) {}
  std::vector<int64_t> indices(int64_t epoch) const override;
  int64_t size() const override { return n_; }
  std::optional<uint64_t> seed() const override { return seed_; }
  bool seed_was_drawn() const override { return drawn_; }
  std::shared_ptr<const Sampler> with_seed(uint64_t seed) const override;

 private:
  int64_t n_;
  uint64_t seed_;
  bool drawn_;
};

// Deterministic permutation of [0, n) for (seed, epoch) using the counter-based generator.
std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed, int64_t epoch);

// Splits an index list into batches; the last short batch is dropped when drop_last.
std::vector<std::vector<int64_t>> make_batches(const std::vector<int64_t>& indices, int64_t batch_size,
                                               bool drop_last);

}  // namespace ember::data
