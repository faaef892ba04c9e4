// Sharded data parallel over real processes (fsdp_worker over a TcpStore): equivalence to one
// process at 2 and 4 ranks (an MLP) and at 2, 3 and 4 (BERT-mini), the per-stage memory
// formula, FULL_SHARD under a memory cap that replication exceeds, and a rank lost mid-training.
#include <gtest/gtest.h>

#include "process_test_util.h"

using ember::testing::run_rank_processes;

namespace {
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
}  // namespace

TEST(FSDPProcesses, EveryStrategyOnTwoAndFourProcessesMatchesOneProcess) {
  for (int world : {2, 4}) {
    auto ranks = run_rank_processes("fsdp_worker", "train", world, std::chrono::seconds(120));
    for (size_t r = 0; r < ranks.size(); ++r) {
      const std::string log = ranks[r].take_log();
      EXPECT_TRUE(ranks[r].exited_ok()) << "world " << world << " rank " << r << ":\n" << log;
      for (const char* s : {"NO_SHARD ok", "SHARD_OPTIMIZER ok", "SHARD_GRAD_OP ok", "FULL_SHARD ok"})
        EXPECT_TRUE(contains(log, s)) << s << " missing, world " << world << " rank " << r << ":\n" << log;
    }
  }
}

TEST(FSDPProcesses, LiveBytesAfterAStepFollowEachStagesFormula) {
  auto ranks = run_rank_processes("fsdp_worker", "memory", 4, std::chrono::seconds(120));
  for (size_t r = 0; r < ranks.size(); ++r) {
    const std::string log = ranks[r].take_log();
    EXPECT_TRUE(ranks[r].exited_ok()) << "rank " << r << ":\n" << log;
    for (const char* s : {"NO_SHARD memory ok", "SHARD_OPTIMIZER memory ok", "SHARD_GRAD_OP memory ok",
                          "FULL_SHARD memory ok"})
      EXPECT_TRUE(contains(log, s)) << s << " missing, rank " << r << ":\n" << log;
  }
}

TEST(FSDPProcesses, BertMiniOnTwoThreeAndFourProcessesMatchesOneProcess) {
  for (int world : {2, 3, 4}) {
    auto ranks = run_rank_processes("fsdp_worker", "bert", world, std::chrono::seconds(300));
    for (size_t r = 0; r < ranks.size(); ++r) {
      const std::string log = ranks[r].take_log();
      EXPECT_TRUE(ranks[r].exited_ok()) << "world " << world << " rank " << r << ":\n" << log;
      for (const char* s : {"NO_SHARD bert ok", "SHARD_OPTIMIZER bert ok", "SHARD_GRAD_OP bert ok", "FULL_SHARD bert ok",
                            "FULL_SHARD param_dtype bfloat16 bert ok"})
        EXPECT_TRUE(contains(log, s)) << s << " missing, world " << world << " rank " << r << ":\n" << log;
    }
  }
}

TEST(FSDPProcesses, FullShardTrainsUnderAMemoryCapReplicationExceeds) {
  auto ranks = run_rank_processes("fsdp_worker", "cap", 4, std::chrono::seconds(120));
  for (size_t r = 0; r < ranks.size(); ++r) {
    const std::string log = ranks[r].take_log();
    EXPECT_TRUE(ranks[r].exited_ok()) << "rank " << r << ":\n" << log;
    EXPECT_TRUE(contains(log, "memory cap ok")) << "rank " << r << ":\n" << log;
  }
}

// SHARD_GRAD_OP loses the rank in a reduce-scatter, FULL_SHARD in an all-gather.
TEST(FSDPProcesses, ARankLostMidTrainingFailsEverySurvivorNamingIt) {
  for (const char* mode : {"kill", "kill_gather"}) {
    const auto start = std::chrono::steady_clock::now();
    auto ranks = run_rank_processes("fsdp_worker", mode, 3, std::chrono::seconds(60));
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (size_t r = 0; r + 1 < ranks.size(); ++r) {
      const std::string log = ranks[r].take_log();
      EXPECT_TRUE(ranks[r].exited_ok()) << mode << " rank " << r << ":\n" << log;
      EXPECT_TRUE(contains(log, "error: ")) << mode << ":\n" << log;
      EXPECT_TRUE(contains(log, "rank 2")) << mode << ":\n" << log;
    }
    EXPECT_LT(took, 2 * 5.0 + 1.0 + 15.0) << mode;  // the timeout, the survivors' stay, start-up on a loaded machine
  }
}
