// Sharding a DataLoader's batches across data-parallel processes, the twin of Accelerate's
// prepare_data_loader (BatchSamplerShard + DataLoaderShard + the GradientState bookkeeping).
//
// Every process builds the same underlying batch sequence for an epoch (same dataset, same
// sampler, same seed), then keeps its own share of it:
//
//   split_batches = false  The loader's batch_size is the per-process batch size. Global step s
//                          gives process r underlying batch number s * R + r (R = num_processes).
//   split_batches = true   The loader's batch_size is the global batch size; each underlying batch
//                          is cut into R equal slices and process r takes slice r. The batch size
//                          must be divisible by R.
//
// When the epoch does not divide evenly (fewer than R batches in the last round, or a short last
// batch) and drop_last is off:
//
//   even_batches = true    Like Accelerate: the missing samples are taken by wrapping around to the
//                          start of the epoch's sample order, so every process runs the same number
//                          of steps, all with full batches. The final global step then holds
//                          padding_samples() duplicates after its remainder() real samples.
//   even_batches = false   No duplicates: the trailing processes get one batch fewer, or (with
//                          split_batches) a shorter or no final slice.
//
// With drop_last, rounds that cannot give every process a full batch are dropped. With one
// process nothing is sharded: the loader yields exactly what the DataLoader would.
//
// Concatenating, step by step, the batches of all processes in rank order gives the epoch's sample
// order followed by the wrap-around duplicates; gather_for_metrics keeps only the first remainder()
// samples of the last gathered step to undo the padding (Accelerate's GradientState.remainder), and
// end_of_dataloader() says when that last step is the current one.
//
//   data::DataLoader loader(train_set, {.batch_size = 8, .shuffle = true, .seed = 42});
//   data::ShardedDataLoader shard(loader, {.num_processes = world, .process_index = rank});
//   for (int epoch = 0; epoch < 3; ++epoch) { shard.set_epoch(epoch); for (auto& batch : shard) ...; }
#pragma once
#include <optional>

#include "data/dataloader.h"

namespace ember::data {

struct ShardOptions {
  int num_processes = 1;
  int process_index = 0;
  bool split_batches = false;
  bool even_batches = true;
  std::optional<bool> drop_last = std::nullopt;  // default: the wrapped loader's drop_last
};

// A DataLoader's dataset, sampler and options (workers, collate, seed) seen by one process. It
// keeps its own epoch and resume point, like a DataLoader.
class ShardedDataLoader {
 public:
  // Copies what it needs from `base` (including its current epoch); `base` may go away.
  ShardedDataLoader(const DataLoader& base, ShardOptions opt);

  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }
  // This process's batches per epoch.
  int64_t size() const;
  // Skips this process's first `n` batches of the next iteration (resuming mid-epoch).
  void skip_first_batches(int64_t n);

  const ShardOptions& shard_options() const { return shard_; }
  const DataLoaderOptions& options() const { return opt_; }
  const Dataset& dataset() const { return *dataset_; }
  const Sampler& sampler() const { return *sampler_; }
  bool drop_last() const { return drop_last_; }
  // Samples per batch on this process, and per global step on all processes together.
  int64_t batch_size() const;
  int64_t total_batch_size() const;

  // Distinct samples in an epoch (the sampler's length).
  int64_t total_dataset_length() const { return sampler_->size(); }
  // Real samples in the final global step when that step is partly padding or partly empty
  // (total_dataset_length() % total_batch_size()); 0 when it is full of real samples or the
  // epoch drops its last round.
  int64_t remainder() const;
  // Wrap-around duplicates at the end of the final global step (0 unless even_batches pads).
  int64_t padding_samples() const;
  // True from the moment this process's last batch of the pass is handed out until the next
  // pass begins.
  bool end_of_dataloader() const;

  // The sample indices of this process's batches for `epoch`, in order.
  std::vector<std::vector<int64_t>> batch_indices(int64_t epoch) const;

  using Iterator = DataLoader::Iterator;
  Iterator begin();
  Iterator end() { return Iterator(); }

 private:
  std::shared_ptr<const Dataset> dataset_;  // declared before pass_: the pass reads it
  std::shared_ptr<const Sampler> sampler_;
  DataLoaderOptions opt_;
  ShardOptions shard_;
  bool drop_last_;
  int64_t epoch_ = 0;
  int64_t skip_ = 0;
  std::shared_ptr<DataLoader::Pass> pass_;
};

}  // namespace ember::data
