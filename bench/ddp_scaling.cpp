// Data-parallel weak scaling on the CPU: the bert_train model and batches, one process per
// rank under `ember launch`, gradients averaged by DistributedDataParallel over Gloo.
//
//   ember launch --num_processes 2 --num_cpu_threads_per_process 1 ddp_scaling --config bert-mini --task cls
//
// Every rank trains on its own random batches of the same size (weak scaling). Rank 0 prints one
// JSON line: the job's median step time (the slowest rank per step), and how much of the
// all-reduce time backward hid. bench/ddp_scaling.sh runs 1 and 2 ranks and the PyTorch peer.
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench/scaling_common.h"
#include "distributed/ddp.h"
#include "distributed/process_group.h"

using namespace ember;

namespace {
struct Args : bench::ScalingArgs {
  double bucket_mb = 25.0;
  double first_bucket_mb = 1.0;
  std::string task = "cls";
  distributed::CommHookType hook = distributed::CommHookType::NONE;
  int powersgd_rank = 4;
  bool sparse_embeddings = false;
  bool overlap_optimizer = false;
};

bool yes_or_no(const std::string& flag, const std::string& v) {
  EMBER_CHECK(v == "yes" || v == "no", "ddp_scaling: ", flag, " must be yes or no, got ", v);
  return v == "yes";
}

Args parse(int argc, char** argv) {
  Args a;
  bench::parse_scaling_args(
      argc, argv, a, "ddp_scaling",
      "usage: ddp_scaling [--config bert-mini|bert-tiny|bert-base] [--task cls|mlm] [--batch B] [--seq S]\n"
      "                   [--warmup W] [--steps N] [--threads T] [--bucket-mb M] [--first-bucket-mb M]\n"
      "                   [--comm-hook no|fp16|bf16|power_sgd] [--powersgd-rank R] [--sparse-embeddings yes|no]\n"
      "                   [--overlap-optimizer yes|no] [--seed S]\n",
      [&](const std::string& k, const std::string& v) {
        if (k == "--task") a.task = v;
        else if (k == "--bucket-mb") a.bucket_mb = std::stod(v);
        else if (k == "--first-bucket-mb") a.first_bucket_mb = std::stod(v);
        else if (k == "--comm-hook") a.hook = distributed::parse_comm_hook(v);
        else if (k == "--powersgd-rank") a.powersgd_rank = std::stoi(v);
        else if (k == "--sparse-embeddings") a.sparse_embeddings = yes_or_no(k, v);
        else if (k == "--overlap-optimizer") a.overlap_optimizer = yes_or_no(k, v);
        else return false;
        return true;
      });
  EMBER_CHECK(a.task == "mlm" || a.task == "cls", "ddp_scaling: --task must be mlm or cls, got ", a.task);
  return a;
}
}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    const auto [info, pg] = bench::join_job(a);
    bench::BertBenchModel model(bench::bert_config(a), a.task);
    if (a.sparse_embeddings)  // the word embeddings' lookup rows are all-gathered, not the table reduced
      for (auto& [name, p] : model.module->named_parameters())
        if (name.ends_with("word_embeddings.weight")) p.set_row_sparse_grad();
    std::unique_ptr<distributed::DistributedDataParallel> ddp;
    if (pg)
      ddp = std::make_unique<distributed::DistributedDataParallel>(
          model.module, pg,
          distributed::DDPOptions{.bucket_cap_mb = a.bucket_mb,
                                  .first_bucket_cap_mb = a.first_bucket_mb,
                                  .comm_hook = a.hook,
                                  .powersgd = {.matrix_approximation_rank = a.powersgd_rank, .start_iter = 2}});
    auto opt = std::make_shared<optim::AdamW>(model.module->parameters(), optim::AdamWOptions{.lr = 1e-4});
    if (ddp && a.overlap_optimizer) {
      ddp->overlap_optimizer_step(opt);
      model.optimizer_stepped_in_backward = true;
    }
    manual_seed(a.seed + 1000 * uint64_t(info.rank));  // each rank its own batches

    std::vector<double> times = bench::timed_steps(model, *opt, a, "ddp_scaling", pg.get(), [&] {
      if (ddp) ddp->reset_comm_stats();
    });

    times = bench::slowest_rank_times(pg.get(), std::move(times));
    double comm_ms = 0, exposed_ms = 0;
    if (ddp) {
      const auto& s = ddp->comm_stats();
      comm_ms = s.steps ? s.total_comm_ms / double(s.steps) : 0.0;
      exposed_ms = s.steps ? s.total_exposed_ms / double(s.steps) : 0.0;
    }
    if (info.rank == 0) {
      const double med = bench::median(times);
      std::printf(
          "{\"kind\": \"result\", \"framework\": \"ember\", \"task\": \"%s\", \"world_size\": %d, \"threads\": %d, "
          "\"layers\": %lld, \"hidden\": %lld, \"batch_per_rank\": %lld, \"seq\": %lld, \"steps\": %lld, "
          "\"median_step_ms\": %.2f, \"tokens_per_s\": %.1f, \"allreduce_ms_per_step\": %.2f, "
          "\"exposed_allreduce_ms_per_step\": %.2f, \"hidden_share\": %.3f, \"buckets\": %lld, \"comm_hook\": \"%s\", "
          "\"bytes_sent_per_step\": %lld, \"sparse_embeddings\": %s, \"overlap_optimizer\": %s}\n",
          a.task.c_str(), info.world_size, a.threads, (long long)a.layers, (long long)a.hidden, (long long)a.batch,
          (long long)a.seq, (long long)a.steps, med, double(a.batch * a.seq * info.world_size) / (med / 1000.0),
          comm_ms, exposed_ms, comm_ms > 0 ? 1.0 - exposed_ms / comm_ms : 0.0,
          ddp ? (long long)ddp->bucket_sizes().size() : 0LL, distributed::comm_hook_name(a.hook),
          ddp && ddp->comm_stats().steps ? (long long)(ddp->comm_stats().bytes_reduced / ddp->comm_stats().steps) : 0LL,
          a.sparse_embeddings ? "true" : "false", a.overlap_optimizer && ddp ? "true" : "false");
    }
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
