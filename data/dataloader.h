// DataLoader: batches from a dataset in sampler order, optionally built by background worker
// threads that prefetch ahead while the batches still come out in order.
//
//   data::DataLoader loader(train_set, {.batch_size = 32, .shuffle = true});
//   for (int epoch = 0; epoch < 3; ++epoch) { loader.set_epoch(epoch); for (auto& batch : loader) ...; }
#pragma once
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "data/collate.h"
#include "data/sampler.h"

namespace ember::data {

// Options are designated initialisers, and C++ wants them in declaration order
// (`{.pin_memory = true, .num_workers = 4}` does not compile; `{.num_workers = 4, .pin_memory =
// true}` does). The order: batch_size, shuffle, drop_last, num_workers, prefetch_factor,
// pin_memory, seed, collate.
struct DataLoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = false;
  bool drop_last = false;
  int num_workers = 0;      // 0: batches are built on the calling thread
  int prefetch_factor = 2;  // batches in flight per worker
  // Batches in page-locked memory, so that batch.to(gpu, true) overlaps with compute. Needs a
  // CUDA device; without one it has no effect, as in PyTorch.
  bool pin_memory = false;
  // Shuffle seed (the permutation also depends on the epoch). Unset: drawn from Ember's
  // generator when the loader is built, so manual_seed / Accelerator::set_seed before it decide
  // the order, as torch.manual_seed does; a seed given here wins. sampler().seed() tells which.
  std::optional<uint64_t> seed = std::nullopt;
  CollateFn collate = nullptr;  // default: stack_collate
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions opt);
  // With an explicit sampler (e.g. a distributed one); shuffle must then be false.
  DataLoader(std::shared_ptr<const Dataset> dataset, std::shared_ptr<const Sampler> sampler, DataLoaderOptions opt);
  ~DataLoader();

  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }
  // Batches per epoch.
  int64_t size() const;
  const DataLoaderOptions& options() const { return opt_; }
  const Dataset& dataset() const { return *dataset_; }
  const Sampler& sampler() const { return *sampler_; }
  // Shared handles, for loaders built on this one's dataset and sampler (data/shard.h).
  std::shared_ptr<const Dataset> dataset_ptr() const { return dataset_; }
  std::shared_ptr<const Sampler> sampler_ptr() const { return sampler_; }
  // Skips the first `n` batches of the next iteration (resuming mid-epoch).
  void skip_first_batches(int64_t n) { skip_ = n; }

  class Iterator;
  Iterator begin();
  Iterator end();

  // One pass over an epoch; owned by the iterator.
  class Pass;

 private:
  void validate();
  std::shared_ptr<const Dataset> dataset_;
  std::shared_ptr<const Sampler> sampler_;
  DataLoaderOptions opt_;
  int64_t epoch_ = 0;
  int64_t skip_ = 0;
  std::shared_ptr<Pass> pass_;
};

class DataLoader::Pass {
 public:
  // `collate_ids` (one per batch, optional) replaces the batch's position as the batch index the
  // collate function sees, so a sharded pass can give every rank's batches distinct ids.
  Pass(const Dataset& dataset, std::vector<std::vector<int64_t>> batches, const DataLoaderOptions& opt,
       int64_t epoch, int64_t first_batch, std::vector<int64_t> collate_ids = {});
  ~Pass();
  // The next batch in order, or nullopt at the end. Rethrows a worker's exception.
  std::optional<Batch> next();
  // Batches handed out so far (skipped ones included) and batches in the whole pass.
  int64_t position() const { return next_index_; }
  int64_t size() const { return int64_t(batches_.size()); }

 private:
  Batch build(int64_t batch_index);
  void worker_loop();

  const Dataset& dataset_;
  std::vector<std::vector<int64_t>> batches_;
  std::vector<int64_t> collate_ids_;
  DataLoaderOptions opt_;
  CollateFn collate_;
  bool pin_;  // pin_memory was asked for and a CUDA device exists
  int64_t epoch_;
  int64_t next_index_;  // next batch handed to the caller
  // worker state
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t next_to_build_ = 0;
  std::map<int64_t, Batch> ready_;
  std::map<int64_t, std::exception_ptr> errors_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

class DataLoader::Iterator {
 public:
  Iterator() = default;
  explicit Iterator(std::shared_ptr<Pass> pass);
  Batch& operator*() { return *current_; }
  Batch* operator->() { return &*current_; }
  Iterator& operator++();
  bool operator==(const Iterator& o) const { return at_end() == o.at_end(); }
  bool operator!=(const Iterator& o) const { return !(*this == o); }

 private:
  bool at_end() const { return !current_.has_value(); }
  std::shared_ptr<Pass> pass_;
  std::optional<Batch> current_;
};

}  // namespace ember::data
