#include "accelerate/accelerator_state.h"

#include <charconv>
#include <cstdlib>
#include <iterator>
#include <mutex>

#include "core/device_api.h"
#include "core/error.h"
#include "core/parallel.h"
#include "data/shard.h"
#include "distributed/default_process_group.h"
#include "distributed/rendezvous.h"

namespace ember::distributed {

namespace {

std::mutex state_mutex;
std::shared_ptr<AcceleratorState> process_state;

// EMBER_NUM_THREADS (set by `ember launch`), else the CPUs Slurm gave the task
// (srun --cpus-per-task) when srun started this process itself.
void apply_thread_count_from_env(const RendezvousInfo& info) {
  const char* name = "EMBER_NUM_THREADS";
  const char* v = std::getenv(name);
  if ((!v || !*v) && info.started_by == "Slurm") {
    name = "SLURM_CPUS_PER_TASK";
    v = std::getenv(name);
  }
  if (!v || !*v) return;
  const std::string s = v;
  int n = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  EMBER_CHECK(ec == std::errc() && ptr == s.data() + s.size() && n >= 1, "Accelerator: ", name, "='", s,
              "' must be a positive integer");
  set_num_threads(n);
}

Device choose_device(bool cpu, int local_rank) {
  if (cpu || !cuda_is_available()) return Device::cpu();
  return Device::cuda(local_rank % cuda_device_count());
}

}  // namespace

std::shared_ptr<AcceleratorState> AcceleratorState::initialize(bool cpu, std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(state_mutex);
  if (process_state) {
    // Without `cpu` an Accelerator takes the device the process has; an explicit request for
    // the CPU cannot be met once the process runs on a GPU.
    EMBER_CHECK(!cpu || process_state->device_.is_cpu(), "Accelerator: this process already runs on ",
                process_state->device_.str(), "; a later Accelerator cannot move it to the CPU ",
                "(create the first Accelerator of the process with cpu = true)");
    return process_state;
  }
  const RendezvousInfo info = rendezvous_info_from_env();
  std::shared_ptr<AcceleratorState> s(new AcceleratorState());
  s->rank_ = info.rank;
  s->local_rank_ = info.local_rank;
  s->world_size_ = info.world_size;
  s->local_world_size_ = info.local_world_size;
  s->device_ = choose_device(cpu, info.local_rank);
  apply_thread_count_from_env(info);
  if (s->device_.is_cuda()) cuda_set_device(s->device_.index);
  if (info.world_size > 1) {
    s->store_ = rendezvous(info, timeout);
    ProcessGroupOptions opt;
    opt.timeout = timeout;
    opt.cuda_device = s->device_.is_cuda() ? s->device_.index : -1;
    const std::string backend = s->device_.is_cuda() ? "nccl" : "gloo";
    s->pg_ = new_process_group(s->store_, info.rank, info.world_size, backend, opt);
    set_default_process_group(s->pg_);
  }
  process_state = s;
  return s;
}

std::shared_ptr<AcceleratorState> AcceleratorState::current() {
  std::lock_guard<std::mutex> lock(state_mutex);
  return process_state;
}

std::string AcceleratorState::distributed_type() const {
  if (world_size_ == 1) return "NO";
  return device_.is_cuda() ? "MULTI_GPU" : "MULTI_CPU";
}

void AcceleratorState::wait_for_everyone() const {
  if (pg_) pg_->barrier();
}

bool GradientState::end_of_dataloader() const { return !active_.empty() && active_.back()->end_of_dataloader(); }

int64_t GradientState::remainder() const { return active_.empty() ? -1 : active_.back()->remainder(); }

int64_t GradientState::padding_samples() const { return active_.empty() ? 0 : active_.back()->padding_samples(); }

int64_t GradientState::total_batch_size() const { return active_.empty() ? 0 : active_.back()->total_batch_size(); }

void GradientState::pop_active(const data::ShardedDataLoader* loader) {
  for (auto it = active_.rbegin(); it != active_.rend(); ++it) {
    if (*it == loader) {
      active_.erase(std::next(it).base());
      return;
    }
  }
}

}  // namespace ember::distributed
