// Samplers decide the order of examples in an epoch; BatchSampler groups them.
#pragma once
#include <cstdint>
#include <vector>

namespace ember::data {

class Sampler {
 public:
  virtual ~Sampler() = default;
  // The indices for `epoch`; the same epoch always gives the same order.
  virtual std::vector<int64_t> indices(int64_t epoch) const = 0;
  virtual int64_t size() const = 0;
};

class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t n) : n_(n) {}
  std::vector<int64_t> indices(int64_t epoch) const override;
  int64_t size() const override { return n_; }

 private:
  int64_t n_;
};

// A permutation drawn from (seed, epoch): reshuffled every epoch, reproducible everywhere.
class RandomSampler : public Sampler {
 public:
  RandomSampler(int64_t n, uint64_t seed) : n_(n), seed_(seed) {}
  std::vector<int64_t> indices(int64_t epoch) const override;
  int64_t size() const override { return n_; }

 private:
  int64_t n_;
  uint64_t seed_;
};

// Deterministic permutation of [0, n) for (seed, epoch) using the counter-based generator.
std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed, int64_t epoch);

// Splits an index list into batches; the last short batch is dropped when drop_last.
std::vector<std::vector<int64_t>> make_batches(const std::vector<int64_t>& indices, int64_t batch_size,
                                               bool drop_last);

}  // namespace ember::data
