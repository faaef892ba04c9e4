// AcceleratedDataLoader: what Accelerator::prepare makes of a DataLoader, the twin of
// Accelerate's DataLoaderShard. It reads this process's share of every epoch (data/shard.h),
// moves batches to the Accelerator's device, and while it is iterated it is the active loader
// of the GradientState: when it hands out the last batch of its epoch, end_of_dataloader() turns
// true, which forces a synchronising step under accumulate() and lets gather_for_metrics drop
// the wrap-around duplicates.
//
// Like Accelerate, it counts epochs itself: a completed pass moves to the next epoch, and
// set_epoch() overrides the count. It remembers how many batches of the current epoch it
// handed out, which save_state records and load_state restores, so the next pass of that epoch
// resumes after the batches already seen:
//
//   acc.load_state();                                 // e.g. epoch 1, 3 batches in
//   for (int64_t e = loader->epoch(); e < epochs; ++e) {
//     loader->set_epoch(e);                           // same epoch: the resume point is kept
//     for (auto& batch : *loader) ...                 // starts at batch 3 of epoch 1
//   }
#pragma once
#include <memory>
#include <optional>

#include "accelerate/accelerator_state.h"
#include "data/shard.h"

namespace ember::distributed {

// Where a loader stands: `position` batches of epoch `epoch` were handed out; `seed` is the
// shuffle seed when it was drawn from the generator (restored with the position, so that a
// resumed run continues the same order however the loader drew its seed this time).
struct LoaderPosition {
  int64_t epoch = 0;
  int64_t position = 0;
  std::optional<uint64_t> seed = std::nullopt;
  // The global batch the position counts in (0: unknown), so a job with another number of
  // processes resumes after the same samples.
  int64_t total_batch_size = 0;
};

class AcceleratedDataLoader {
 public:
  AcceleratedDataLoader(const data::DataLoader& base, data::ShardOptions shard,
                        std::shared_ptr<GradientState> gradient_state, Device device);
  ~AcceleratedDataLoader();
  AcceleratedDataLoader(const AcceleratedDataLoader&) = delete;
  AcceleratedDataLoader& operator=(const AcceleratedDataLoader&) = delete;

  // Chooses the epoch of the next pass (the shuffle order depends on it). Choosing another
  // epoch than the one a resume point belongs to drops that resume point.
  void set_epoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }
  // This process's batches per epoch.
  int64_t size() const { return shard_.size(); }
  // Batches of the current epoch handed out so far (skipped ones included).
  int64_t position() const { return position_; }
  // The next pass of the current epoch starts after its first `n` batches.
  void skip_first_batches(int64_t n);

  // Checkpointing: a position at the end of an epoch is stored as the start of the next one.
  LoaderPosition state() const;
  // Checked first (validate_state): a refused position changes nothing.
  void restore(const LoaderPosition& p);
  // Raises ember::Error unless `p` is a position this loader can resume at: epoch >= 0 and
  // 0 <= position < size() (position 0 always).
  void validate_state(const LoaderPosition& p) const;
  // Shuffles from `seed` from now on (the sampler's with_seed); an error for a sampler without
  // a seed.
  void use_seed(uint64_t seed);

  const data::ShardedDataLoader& shard() const { return shard_; }
  int64_t batch_size() const { return shard_.batch_size(); }
  int64_t total_batch_size() const { return shard_.total_batch_size(); }
  int64_t total_dataset_length() const { return shard_.total_dataset_length(); }
  bool end_of_dataloader() const { return shard_.end_of_dataloader(); }
  Device device() const { return device_; }

  class Iterator;
  Iterator begin();
  Iterator end();

 private:
  // Registration as the GradientState's active loader for the length of one pass.
  struct ActivePass;
  void on_batch();
  void on_pass_end();

  // What the shard was built from, to build it again with another seed.
  std::shared_ptr<const data::Dataset> dataset_;
  data::DataLoaderOptions base_options_;
  data::ShardedDataLoader shard_;
  std::shared_ptr<GradientState> gradient_state_;
  Device device_;
  int64_t epoch_ = 0;
  int64_t position_ = 0;
  std::optional<LoaderPosition> resume_;  // skip this many batches when this epoch's pass starts
};

class AcceleratedDataLoader::Iterator {
 public:
  Iterator() = default;
  Batch& operator*() { return current_; }
  Batch* operator->() { return &current_; }
  Iterator& operator++();
  bool operator==(const Iterator& o) const { return at_end() == o.at_end(); }
  bool operator!=(const Iterator& o) const { return !(*this == o); }

 private:
  friend class AcceleratedDataLoader;
  Iterator(AcceleratedDataLoader* owner, std::shared_ptr<ActivePass> pass, data::ShardedDataLoader::Iterator inner);
  bool at_end() const { return owner_ == nullptr; }
  void load_current();

  AcceleratedDataLoader* owner_ = nullptr;
  std::shared_ptr<ActivePass> pass_;
  data::ShardedDataLoader::Iterator inner_;
  Batch current_;
};

}  // namespace ember::distributed
