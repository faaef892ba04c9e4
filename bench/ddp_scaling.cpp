// Data-parallel weak scaling on the CPU: the bert_train model and batches, one process per
// rank under `ember launch`, gradients averaged by DistributedDataParallel over Gloo.
//
//   ember launch --num_processes 2 --num_cpu_threads_per_process 1 ddp_scaling --config bert-mini --task cls
//
// Every rank trains on its own random batches of the same size (weak scaling). Rank 0 prints one
// JSON line: the job's median step time (the slowest rank per step), and how much of the
// all-reduce time backward hid. bench/ddp_scaling.sh runs 1 and 2 ranks and the PyTorch peer.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/bert_bench_model.h"
#include "distributed/ddp.h"
#include "distributed/process_group.h"
#include "distributed/rendezvous.h"
#include "tracking/progress.h"

using namespace ember;

namespace {
struct Args : bench::BertSizes {
  int64_t batch = 16, warmup = 3, steps = 10;
  int threads = 1;
  double bucket_mb = 25.0;
  std::string task = "cls";
  uint64_t seed = 0;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--help") {
      std::printf("usage: ddp_scaling [--config bert-mini|bert-tiny] [--task cls|mlm] [--batch B] [--seq S]\n"
                  "                   [--warmup W] [--steps N] [--threads T] [--bucket-mb M] [--seed S]\n");
      std::exit(0);
    }
    EMBER_CHECK(i + 1 < argc, "ddp_scaling: ", k, " needs a value");
    const std::string v = argv[++i];
    if (k == "--config") bench::apply_bert_preset(a, v, "ddp_scaling");
    else if (k == "--task") a.task = v;
    else if (k == "--batch") a.batch = std::stoll(v);
    else if (k == "--seq") a.seq = std::stoll(v);
    else if (k == "--warmup") a.warmup = std::stoll(v);
    else if (k == "--steps") a.steps = std::stoll(v);
    else if (k == "--threads") a.threads = std::stoi(v);
    else if (k == "--bucket-mb") a.bucket_mb = std::stod(v);
    else if (k == "--seed") a.seed = std::stoull(v);
    else EMBER_FAIL("ddp_scaling: unknown option ", k);
  }
  EMBER_CHECK(a.task == "mlm" || a.task == "cls", "ddp_scaling: --task must be mlm or cls, got ", a.task);
  EMBER_CHECK(a.steps > 0 && a.warmup >= 0, "ddp_scaling: --steps must be positive");
  return a;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    const auto info = distributed::rendezvous_info_from_env();
    set_num_threads(a.threads);
    manual_seed(a.seed);  // the same initial weights everywhere (DDP broadcasts rank 0's anyway)

    bench::BertBenchModel model(bench::bert_config(a), a.task);

    std::shared_ptr<distributed::ProcessGroup> pg;
    std::unique_ptr<distributed::DistributedDataParallel> ddp;
    if (info.world_size > 1) {
      auto store = distributed::rendezvous(info, std::chrono::seconds(60));
      pg = distributed::new_process_group(store, info.rank, info.world_size, "gloo");
      ddp = std::make_unique<distributed::DistributedDataParallel>(
          model.module, pg, distributed::DDPOptions{.bucket_cap_mb = a.bucket_mb});
    }
    optim::AdamW opt(model.module->parameters(), {.lr = 1e-4});
    manual_seed(a.seed + 1000 * uint64_t(info.rank));  // each rank its own batches

    std::vector<double> times;
    ProgressBar bar("ddp_scaling", a.warmup + a.steps);  // drawn by local rank 0 only
    for (int64_t it = 0; it < a.warmup + a.steps; ++it) {
      if (it == a.warmup) {
        if (pg) pg->barrier();
        if (ddp) ddp->reset_comm_stats();
      }
      const double ms = model.train_step(opt, a.batch, a.seq, a.vocab);
      if (it >= a.warmup) times.push_back(ms);
      char post[64];
      std::snprintf(post, sizeof post, "%.0f tok/s per rank", double(a.batch * a.seq) / (ms / 1000.0));
      bar.update(it + 1, post);
    }
    bar.finish();

    // The job moves at the pace of its slowest rank: take the per-step maximum over ranks.
    double comm_ms = 0, exposed_ms = 0;
    if (pg) {
      Tensor t = from_vector(times, {int64_t(times.size())});
      pg->allreduce(t, distributed::ReduceOp::Max)->wait();
      times = t.to_vector<double>();
      const auto& s = ddp->comm_stats();
      comm_ms = s.steps ? s.total_comm_ms / double(s.steps) : 0.0;
      exposed_ms = s.steps ? s.total_exposed_ms / double(s.steps) : 0.0;
    }
    if (info.rank == 0) {
      const double med = median(times);
      std::printf(
          "{\"kind\": \"result\", \"framework\": \"ember\", \"task\": \"%s\", \"world_size\": %d, \"threads\": %d, "
          "\"layers\": %lld, \"hidden\": %lld, \"batch_per_rank\": %lld, \"seq\": %lld, \"steps\": %lld, "
          "\"median_step_ms\": %.2f, \"tokens_per_s\": %.1f, \"allreduce_ms_per_step\": %.2f, "
          "\"exposed_allreduce_ms_per_step\": %.2f, \"hidden_share\": %.3f, \"buckets\": %lld}\n",
          a.task.c_str(), info.world_size, a.threads, (long long)a.layers, (long long)a.hidden, (long long)a.batch,
          (long long)a.seq, (long long)a.steps, med, double(a.batch * a.seq * info.world_size) / (med / 1000.0),
          comm_ms, exposed_ms, comm_ms > 0 ? 1.0 - exposed_ms / comm_ms : 0.0,
          ddp ? (long long)ddp->bucket_sizes().size() : 0LL);
    }
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
