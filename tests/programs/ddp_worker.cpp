// One rank of a DDP job over real processes, started by tests/distributed/test_ddp.cpp:
//   ddp_worker <mode> <rank> <world> <port>
// Rank 0 serves a TcpStore on 127.0.0.1:<port>. Modes:
//   train     K SGD steps with DDP must match one process on the concatenated batches, both
//             plainly and with no_sync gradient accumulation; prints "equivalence ok" and
//             "no_sync ok".
//   mismatch  rank 1 builds a wider model; construction must fail on every rank; prints the error.
//   sparse    BERT-mini MLM (tied decoder), 20 AdamW steps of 2 micro-batches under no_sync with
//             clipping: with row-sparse word embeddings it must land where the dense table's run
//             does (99.9% of entries within 1e-6, all within 1e-4: the tied gradient sums in
//             another order), sending no more than the rows on top; prints "sparse embeddings ok".
// Exit status 0 when the mode's expectation held.
#include <chrono>
#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>

#include "ddp_test_model.h"
#include "fsdp_bert_checks.h"
#include "distributed/process_group_gloo.h"
#include "distributed/tcp_store.h"

using namespace ember;
using namespace ember::distributed;
using namespace ember::ddp_test;

namespace {

constexpr auto kTimeout = std::chrono::seconds(30);

// `tolerance`: 1e-5 for the f32 wire; a compressing comm hook rounds each gradient.
bool check_training(const std::shared_ptr<ProcessGroup>& pg, const TrainPlan& plan, uint64_t seed, const char* label,
                    CommHookType hook = CommHookType::NONE, double tolerance = 1e-5) {
  auto reference = make_mlp(seed);
  train_reference(*reference, plan, pg->size());
  auto model = make_mlp(seed + uint64_t(pg->rank()));  // differently initialised: DDP broadcasts rank 0's
  DistributedDataParallel ddp(model, pg, {.bucket_cap_mb = kSmallBucketMb, .comm_hook = hook});
  train_ddp(ddp, plan);
  const double diff = max_abs_diff(*model, *reference);
  const double moved = max_abs_diff(*reference, *make_mlp(seed));
  // Three buckets, laid out again after the first pass in the order gradients came.
  const bool ok = diff <= tolerance && moved > 1e-3 && ddp.bucket_sizes().size() == 3 && ddp.buckets_rebuilt();
  std::printf("rank %d %s: max abs diff %.3g (training moved parameters by %.3g), %zu buckets, "
              "comm %.3f ms of which exposed %.3f ms\n",
              pg->rank(), label, diff, moved, ddp.bucket_sizes().size(), ddp.comm_stats().total_comm_ms,
              ddp.comm_stats().total_exposed_ms);
  if (ok) std::printf("%s ok\n", label);
  return ok;
}

// BERT-mini MLM under DDP on this rank's rows, the word embeddings dense or row-sparse.
fsdp_checks::HostValues train_bert(const std::shared_ptr<ProcessGroup>& pg, bool sparse, int64_t* bytes_per_step) {
  using namespace fsdp_checks;
  manual_seed(11);
  auto model = std::make_shared<nn::BertForMaskedLM>(mini_bert_config());
  if (sparse) model->bert->embeddings->word_embeddings->set_sparse(true);
  DistributedDataParallel ddp(model, pg);
  optim::AdamW opt(model->parameters(), kBertAdamW);
  const int64_t global = kRowsPerRank * pg->size();
  for (int step = 0; step < kBertSteps; ++step) {
    for (int m = 0; m < kMicro; ++m) {
      auto [ids, labels] = mlm_rows(step * kMicro + m, global, kRowsPerRank * pg->rank(), kRowsPerRank);
      Tensor loss = model->forward(ids, Tensor(), Tensor(), labels).loss * (1.0 / kMicro);
      if (m + 1 < kMicro) {
        auto guard = ddp.no_sync();
        loss.backward();
      } else {
        loss.backward();
      }
    }
    optim::clip_grad_norm_(model->parameters(), kClip);
    opt.step();
    opt.zero_grad();
  }
  *bytes_per_step = ddp.comm_stats().bytes_reduced / std::max<int64_t>(1, ddp.comm_stats().steps);
  return host_values(model->named_parameters());
}

bool check_sparse_bert(const std::shared_ptr<ProcessGroup>& pg) {
  int64_t dense_bytes = 0, sparse_bytes = 0;
  const auto dense = train_bert(pg, false, &dense_bytes);
  const auto sparse = train_bert(pg, true, &sparse_bytes);
  const fsdp_checks::Distance d = fsdp_checks::distance(sparse, dense);
  std::printf("rank %d BERT-mini, %d ranks, row-sparse word embeddings vs dense: max abs diff %.3g, mean %.3g, "
              "%.4f%% over 1e-6; bytes sent per step %lld vs %lld\n",
              pg->rank(), pg->size(), d.max, d.mean, 100 * d.fraction_over_1e6, (long long)sparse_bytes,
              (long long)dense_bytes);
  // The tied decoder's dense part is reduced either way; the rows come on top, at most every
  // token of the step's micro-batches.
  const int64_t rows_bound = fsdp_checks::kMicro * fsdp_checks::kRowsPerRank * 24 * (8 + 4 * 256);
  // The tied table's gradient sums in another association ((d0 + d1) + (l0 + l1) for the dense
  // decoder part d and the rows l, where the dense table reduces (d0 + l0) + (d1 + l1)), and
  // AdamW carries that rounding for 20 steps: the bounds of the sharded runs' f32 checks.
  const bool ok = d.fraction_over_1e6 <= fsdp_checks::kF32FractionOver1e6 && d.mean <= fsdp_checks::kF32MeanTolerance &&
                  d.max <= fsdp_checks::kF32MaxTolerance && sparse_bytes <= dense_bytes + rows_bound;
  if (ok) std::printf("sparse embeddings ok\n");
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: ddp_worker <train|mismatch|sparse> <rank> <world> <port>\n");
    return 2;
  }
  const std::string mode = argv[1];
  const int rank = std::atoi(argv[2]), world = std::atoi(argv[3]), port = std::atoi(argv[4]);
  try {
    auto store = std::make_shared<TcpStore>("127.0.0.1", port, rank == 0, kTimeout);
    ProcessGroupOptions opt;
    opt.timeout = kTimeout;
    auto pg = std::make_shared<ProcessGroupGloo>(store, rank, world, opt);

    if (mode == "train") {
      TrainPlan plain;
      TrainPlan accumulate;
      accumulate.micro_batches = 2;
      accumulate.steps = 3;
      const bool ok = check_training(pg, plain, 500, "equivalence") && check_training(pg, accumulate, 600, "no_sync") &&
                      check_training(pg, plain, 700, "bf16 comm hook", CommHookType::BF16, 1e-3);
      pg->barrier();  // nobody tears down the store while a peer still needs it
      std::fflush(stdout);
      return ok ? 0 : 1;
    }
    if (mode == "sparse") {
      const bool ok = check_sparse_bert(pg);
      pg->barrier();
      std::fflush(stdout);
      return ok ? 0 : 1;
    }
    if (mode == "mismatch") {
      auto model = std::make_shared<Mlp>(kIn, rank == 1 ? kHidden + 1 : kHidden, kOut);
      try {
        DistributedDataParallel ddp(model, pg);
      } catch (const Error& e) {
        std::printf("error: %s\n", e.what());
        pg->barrier();
        return 0;
      }
      std::printf("no error on rank %d\n", rank);
      return 1;
    }
    std::fprintf(stderr, "ddp_worker: unknown mode '%s'\n", mode.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::printf("rank %d failed: %s\n", rank, e.what());
    return 1;
  }
}
