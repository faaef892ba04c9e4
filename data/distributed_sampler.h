// DistributedSampler: each of `num_replicas` processes reads its own share of the dataset, the
// twin of torch.utils.data.DistributedSampler.
//
// Every rank draws the same permutation for (seed, epoch), extends it by wrapping around to a
// multiple of num_replicas (or cuts it down to one with drop_last), and takes every
// num_replicas-th index starting at its rank. The shares are disjoint apart from the wrapped
// duplicates, and together they cover the dataset. Rank and world size are plain integers: no
// process group is needed to build one.
//
//   data::DistributedSampler s(train_set->size(), world_size, rank, /*shuffle=*/true, /*seed=*/42);
//   data::DataLoader loader(train_set, std::make_shared<data::DistributedSampler>(s), {.batch_size = 32});
#pragma once
#include "data/sampler.h"

namespace ember::data {

class DistributedSampler : public Sampler {
 public:
  DistributedSampler(int64_t n, int num_replicas, int rank, bool shuffle = true, uint64_t seed = 0,
                     bool drop_last = false);
  std::vector<int64_t> indices(int64_t epoch) const override;
  // Indices this rank reads per epoch.
  int64_t size() const override { return num_samples_; }
  // Indices all ranks read together per epoch (the dataset size after padding or truncation).
  int64_t total_size() const { return num_samples_ * num_replicas_; }
  int num_replicas() const { return num_replicas_; }
  int rank() const { return rank_; }

 private:
  int64_t n_;
  int num_replicas_;
  int rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t num_samples_;
};

}  // namespace ember::data
