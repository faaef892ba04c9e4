// The process-wide and the training-loop-wide state behind an Accelerator, as Accelerate's
// AcceleratorState (PartialState) and GradientState.
//
// AcceleratorState: who this process is and how it talks to the others. Built once per
// process from the variables `ember launch` (or torchrun) sets: RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (none set: a single process, rank 0 of 1). With
// more than one process, rank 0 serves a TcpStore at MASTER_ADDR:MASTER_PORT, every rank joins
// the rendezvous barrier, then one process group ("gloo" on CPU, "nccl" on CUDA) is created.
// EMBER_NUM_THREADS, when set, sizes Ember's thread pool. Every later Accelerator in the
// process shares the same state.
//
// GradientState: whether this micro-step synchronises gradients (accumulation), and what the
// data loader being iterated says about the end of its epoch (end_of_dataloader, remainder), so
// that the optimizer, the scheduler and gather_for_metrics agree with the loop.
#pragma once
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "distributed/process_group.h"
#include "distributed/store.h"

namespace ember::data {
class ShardedDataLoader;
}

namespace ember::distributed {

class AcceleratorState {
 public:
  // The process's state: built by the first call (from the environment; `cpu` keeps the
  // process on the CPU even when CUDA is present), returned unchanged by later calls. A later
  // call with `cpu` when the process already runs on a GPU is an ember::Error.
  static std::shared_ptr<AcceleratorState> initialize(bool cpu, std::chrono::milliseconds timeout);
  // The state built by initialize(), or nullptr before the first call.
  static std::shared_ptr<AcceleratorState> current();

  int process_index() const { return rank_; }
  int local_process_index() const { return local_rank_; }
  int num_processes() const { return world_size_; }
  int local_num_processes() const { return local_world_size_; }
  bool is_main_process() const { return rank_ == 0; }
  bool is_local_main_process() const { return local_rank_ == 0; }
  Device device() const { return device_; }
  bool use_cpu() const { return device_.is_cpu(); }
  // "NO" (one process), "MULTI_CPU" or "MULTI_GPU".
  std::string distributed_type() const;

  // nullptr for a single process: every collective is then the identity.
  const std::shared_ptr<ProcessGroup>& process_group() const { return pg_; }
  const std::shared_ptr<Store>& store() const { return store_; }

  // Blocks until every process arrived (no-op for a single process).
  void wait_for_everyone() const;

 private:
  AcceleratorState() = default;
  int rank_ = 0;
  int local_rank_ = 0;
  int world_size_ = 1;
  int local_world_size_ = 1;
  Device device_ = Device::cpu();
  std::shared_ptr<Store> store_;
  std::shared_ptr<ProcessGroup> pg_;
};

class GradientState {
 public:
  explicit GradientState(int num_steps = 1) : num_steps_(num_steps) {}

  // Micro-batches per optimizer step (gradient_accumulation_steps).
  int num_steps() const { return num_steps_; }
  // True when the current micro-step ends an accumulation window: the optimizer steps, the
  // scheduler steps, DDP all-reduces. Always true without accumulate().
  bool sync_gradients() const { return sync_gradients_; }
  void set_sync_gradients(bool on) { sync_gradients_ = on; }
  // The end of the loader's epoch forces a synchronising step (Accelerate's sync_with_dataloader).
  bool sync_with_dataloader() const { return sync_with_dataloader_; }
  void set_sync_with_dataloader(bool on) { sync_with_dataloader_ = on; }

  // The innermost loader being iterated hands out (or handed out) its last batch of the epoch.
  bool end_of_dataloader() const;
  // Real samples in the last global step of the active loader's epoch when that step is partly
  // wrap-around padding; -1 when no loader is being iterated.
  int64_t remainder() const;
  // Wrap-around duplicates in the active loader's last global step (0 when none).
  int64_t padding_samples() const;
  // Samples per global step of the active loader (all processes together); 0 when none.
  int64_t total_batch_size() const;
  bool in_dataloader() const { return !active_.empty(); }

  // Loaders register while they are iterated; nested loops (evaluation inside training)
  // make the innermost one active.
  void push_active(const data::ShardedDataLoader* loader) { active_.push_back(loader); }
  void pop_active(const data::ShardedDataLoader* loader);

 private:
  int num_steps_;
  bool sync_gradients_ = true;
  bool sync_with_dataloader_ = true;
  std::vector<const data::ShardedDataLoader*> active_;
};

}  // namespace ember::distributed
