// Sharded data parallel on the CPU: the bert_train MLM model and batches, one process per rank
// under `ember launch`, trained with DistributedDataParallel or with one of the sharding
// strategies of distributed::shard_model over Gloo.
//
//   ember launch --num_processes 2 --num_cpu_threads_per_process 1 fsdp_scaling --mode FULL_SHARD
//
// --mode: ddp, NO_SHARD, SHARD_OPTIMIZER, SHARD_GRAD_OP, FULL_SHARD, or FULL_SHARD_AC
// (FULL_SHARD with activation_checkpointing). The sharded modes wrap every BertLayer as a unit
// (the rest forms the root unit). Every rank trains on its own random batches of the same size
// (weak scaling) and prints one JSON line: the job's median step time (the slowest rank per
// step), global tokens/s, and this rank's memory: the peak of Ember's CPU allocator over the
// timed steps (requested bytes, peak reset after wrapping), what it still holds after them
// (parameters or shards, gradients, optimizer state), and the process's peak RSS. With one
// process the model trains unwrapped whatever the mode. bench/fsdp_scaling.sh runs every mode
// and the PyTorch FSDP2 peer (fsdp_scaling_peer.py).
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench/scaling_common.h"
#include "core/allocator.h"
#include "distributed/ddp.h"
#include "distributed/fsdp.h"
#include "distributed/process_group.h"

using namespace ember;

namespace {
const char* const kModes[] = {"ddp", "NO_SHARD", "SHARD_OPTIMIZER", "SHARD_GRAD_OP", "FULL_SHARD", "FULL_SHARD_AC"};

struct Args : bench::ScalingArgs {
  std::string mode = "FULL_SHARD";
  Args() { batch = 4; }
};

Args parse(int argc, char** argv) {
  Args a;
  bench::parse_scaling_args(
      argc, argv, a, "fsdp_scaling",
      "usage: fsdp_scaling [--mode ddp|NO_SHARD|SHARD_OPTIMIZER|SHARD_GRAD_OP|FULL_SHARD|FULL_SHARD_AC]\n"
      "                    [--config bert-mini|bert-tiny|bert-base] [--batch B] [--seq S]\n"
      "                    [--warmup W] [--steps N] [--threads T] [--seed S]\n",
      [&](const std::string& k, const std::string& v) {
        if (k != "--mode") return false;
        a.mode = v;
        return true;
      });
  EMBER_CHECK(std::find(std::begin(kModes), std::end(kModes), a.mode) != std::end(kModes),
              "fsdp_scaling: unknown --mode ", a.mode,
              " (ddp, NO_SHARD, SHARD_OPTIMIZER, SHARD_GRAD_OP, FULL_SHARD or FULL_SHARD_AC)");
  return a;
}

distributed::FSDPOptions fsdp_options(const std::string& mode) {
  distributed::FSDPOptions o;
  o.transformer_layer_cls_to_wrap = {"BertLayer"};
  o.activation_checkpointing = mode == "FULL_SHARD_AC";
  o.sharding_strategy = distributed::parse_sharding_strategy(mode == "FULL_SHARD_AC" ? "FULL_SHARD" : mode);
  return o;
}

double peak_rss_mb() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) / 1024.0;  // Linux reports KiB
}

constexpr double kMiB = 1024.0 * 1024.0;
}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    const auto [info, pg] = bench::join_job(a);
    bench::BertBenchModel model(bench::bert_config(a), "mlm");
    std::unique_ptr<distributed::DistributedDataParallel> ddp;
    std::shared_ptr<distributed::FullyShardedDataParallel> fsdp;
    if (pg) {
      if (a.mode == "ddp") ddp = std::make_unique<distributed::DistributedDataParallel>(model.module, pg);
      else fsdp = distributed::shard_model(model.module, pg, fsdp_options(a.mode));
    }
    optim::AdamW opt(fsdp ? fsdp->parameters() : model.module->parameters(), {.lr = 1e-4});
    manual_seed(a.seed + 1000 * uint64_t(info.rank));  // each rank its own batches

    cpu_allocator().reset_peak();
    std::vector<double> times = bench::timed_steps(model, opt, a, "fsdp_scaling", pg.get());
    const AllocatorStats mem = cpu_allocator().stats();
    times = bench::slowest_rank_times(pg.get(), std::move(times));

    const double med = bench::median(times);
    std::printf(
        "{\"kind\": \"result\", \"framework\": \"ember\", \"mode\": \"%s\", \"rank\": %d, \"world_size\": %d, "
        "\"threads\": %d, \"layers\": %lld, \"hidden\": %lld, \"batch_per_rank\": %lld, \"seq\": %lld, "
        "\"steps\": %lld, \"units\": %lld, \"median_step_ms\": %.2f, \"tokens_per_s\": %.1f, "
        "\"peak_alloc_mb\": %.1f, \"held_alloc_mb\": %.1f, \"peak_rss_mb\": %.1f}\n",
        a.mode.c_str(), info.rank, info.world_size, a.threads, (long long)a.layers, (long long)a.hidden,
        (long long)a.batch, (long long)a.seq, (long long)a.steps, fsdp ? (long long)fsdp->units().size() : 0LL, med,
        double(a.batch * a.seq * info.world_size) / (med / 1000.0), double(mem.peak_requested_bytes) / kMiB,
        double(mem.requested_bytes_in_use) / kMiB, peak_rss_mb());
    std::fflush(stdout);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
