// One rank of a DDP job over real processes, started by tests/distributed/test_ddp.cpp:
//   ddp_worker <mode> <rank> <world> <port>
// Rank 0 serves a TcpStore on 127.0.0.1:<port>. Modes:
//   train     K SGD steps with DDP must match one process on the concatenated batches, both
//             plainly and with no_sync gradient accumulation; prints "equivalence ok" and
//             "no_sync ok".
//   mismatch  rank 1 builds a wider model; construction must fail on every rank; prints the error.
// Exit status 0 when the mode's expectation held.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "ddp_test_model.h"
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

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: ddp_worker <train|mismatch> <rank> <world> <port>\n");
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
