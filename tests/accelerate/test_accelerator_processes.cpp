// The Accelerator over real processes on loopback: tests/programs/accel_worker started once
// per rank with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (a free port), with no environment at
// all for one process, and through `ember launch`. Every child runs under a deadline and is
// killed when it passes it.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <optional>

#include "nn/io/safetensors.h"
#include "process_test_util.h"
#include "test_util.h"

namespace {

constexpr auto kDeadline = std::chrono::seconds(60);

using ember::testing::env_or;
using ember::testing::free_port;
std::string worker() { return env_or("EMBER_TEST_PROGRAMS", EMBER_TEST_PROGRAMS) + "/accel_worker"; }
std::string ember_cli() { return env_or("EMBER_CLI", EMBER_CLI); }

// Variables that would make a child believe it belongs to some other job.
const char* kJobVariables[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                               "EMBER_MIXED_PRECISION", "EMBER_GRADIENT_ACCUMULATION_STEPS", "EMBER_USE_CPU"};

using Outcome = ember::testing::ChildOutcome;

// Starts args[0] with the environment minus the job variables plus `extra`, output to `log`.
pid_t spawn(const std::vector<std::string>& args, const std::map<std::string, std::string>& extra,
            const std::string& log) {
  std::map<std::string, std::optional<std::string>> changes;
  for (const char* v : kJobVariables) changes[v] = std::nullopt;
  for (const auto& [k, v] : extra) changes[k] = v;
  return ember::testing::spawn_logged(args, log, ember::testing::environment_with(changes));
}

// Waits for every child until the deadline, kills the rest, returns each one's outcome.
std::vector<Outcome> wait_all(const std::vector<pid_t>& pids, const std::vector<std::string>& logs) {
  return ember::testing::collect_outcomes(pids, logs, kDeadline);
}

class AcceleratorProcesses : public ::testing::Test {
 protected:
  // Runs accel_worker as `world` ranks; world 0 means one process with none of the job variables.
  std::vector<Outcome> run(int world, const std::vector<std::string>& args) {
    std::vector<std::string> argv = {worker()};
    argv.insert(argv.end(), args.begin(), args.end());
    std::map<std::string, std::optional<std::string>> env;
    for (const char* v : kJobVariables) env[v] = std::nullopt;
    env["EMBER_USE_CPU"] = "1";  // CPU references are the yardstick: stay on the CPU where a GPU exists
    const std::string logs = dir_.file("run" + std::to_string(runs_++) + "_rank");
    return ember::testing::run_loopback_job(argv, world, logs, env, kDeadline);
  }

  static void expect_all(const std::vector<Outcome>& outcomes, const std::string& marker) {
    for (size_t r = 0; r < outcomes.size(); ++r) {
      EXPECT_EQ(outcomes[r].exit_code, 0) << "rank " << r << ":\n" << outcomes[r].output;
      EXPECT_NE(outcomes[r].output.find(marker), std::string::npos) << "rank " << r << ":\n" << outcomes[r].output;
    }
  }

  ember::testing::TempDir dir_{"accel_processes"};
  int runs_ = 0;
};

TEST_F(AcceleratorProcesses, OneProcessWithNoJobEnvironmentTrains) {
  expect_all(run(0, {"ddp", "4", "3"}), "ddp ok");
}

TEST_F(AcceleratorProcesses, TwoProcessesMatchOneProcessOnTheConcatenatedBatch) {
  // 5 AdamW steps with a linear schedule: 2 ranks at batch 3 == 1 process at batch 6.
  auto outcomes = run(2, {"ddp", "5", "3"});
  expect_all(outcomes, "ddp ok");
  EXPECT_NE(outcomes[1].output.find("rank 1 ddp"), std::string::npos) << outcomes[1].output;
}

TEST_F(AcceleratorProcesses, AccumulationMatchesTheLargeBatchOnOneAndTwoProcesses) {
  expect_all(run(0, {"accum", "3", "2"}), "accum ok");
  auto outcomes = run(2, {"accum", "3", "2"});
  expect_all(outcomes, "accum ok");
  // 3 updates on 2 processes: the schedule advanced 6 steps; the table's other rows too.
  EXPECT_NE(outcomes[0].output.find("updates 3, scheduler steps 6"), std::string::npos) << outcomes[0].output;
  EXPECT_NE(outcomes[0].output.find("with optimizer 6, split_batches 3, every call 6"), std::string::npos)
      << outcomes[0].output;
}

TEST_F(AcceleratorProcesses, OptimizerSteppedDuringBackwardMatchesTheLargeBatch) {
  // AcceleratorOptions::overlap_optimizer_step: DDP steps each bucket as it lands; one process
  // steps as usual.
  expect_all(run(0, {"accum", "3", "2", "overlap"}), "accum overlap ok");
  auto outcomes = run(2, {"accum", "3", "2", "overlap"});
  expect_all(outcomes, "accum overlap ok");
  EXPECT_NE(outcomes[0].output.find("updates 3, scheduler steps 6"), std::string::npos) << outcomes[0].output;
}

TEST_F(AcceleratorProcesses, ShardedDataParallelMatchesTheLargeBatchUnderEachStrategy) {
  // One process: nothing to shard.
  expect_all(run(0, {"fsdp", "SHARD_GRAD_OP", "3", "2", dir_.file("one")}), "fsdp ok");
  for (const char* strategy : {"NO_SHARD", "SHARD_OPTIMIZER", "SHARD_GRAD_OP"}) {
    const std::string ckpt = dir_.file(std::string("ckpt_") + strategy);
    expect_all(run(3, {"fsdp", strategy, "3", "2", ckpt}), "fsdp ok");
    // Sharded optimizers: one file per process beside the shared files.
    const bool sharded = std::string(strategy) != "NO_SHARD";
    EXPECT_EQ(std::filesystem::exists(ckpt + "/optimizer.shard-00002-of-00003.safetensors"), sharded) << strategy;
    EXPECT_EQ(std::filesystem::exists(ckpt + "/optimizer.safetensors"), !sharded) << strategy;
  }
  // sync_each_batch: every micro-batch reduced, the same result.
  expect_all(run(3, {"fsdp", "SHARD_GRAD_OP", "3", "2", dir_.file("ckpt_each"), "sync_each_batch"}), "fsdp ok");
}

TEST_F(AcceleratorProcesses, ACollectiveOnTheMainProcessOnlyFailsAtOnceNamingBothCollectives) {
  // Collective fingerprints: rank 0's allgather meets rank 1's barrier, and both ranks say so
  // within seconds instead of waiting out the 10-minute timeout.
  auto outcomes = run(2, {"main_only_gather"});
  expect_all(outcomes, "main only ok");
  EXPECT_NE(outcomes[1].output.find("rank 0 is in allgather #"), std::string::npos) << outcomes[1].output;
  EXPECT_NE(outcomes[0].output.find("rank 1 in barrier #"), std::string::npos) << outcomes[0].output;
}

TEST_F(AcceleratorProcesses, BuffersFollowRankZeroBeforeEachSynchronisedTrainingForward) {
  expect_all(run(2, {"buffers", "on"}), "buffers ok");
  expect_all(run(2, {"buffers", "off"}), "buffers ok");
}

TEST_F(AcceleratorProcesses, GatherForMetricsSeesEveryValidationSampleOnce) {
  // 11 samples, batch 2 per process: the last round is padded by wrapping around.
  expect_all(run(2, {"metrics", "11", "2", "0"}), "metrics ok");
  // split_batches: global batch 4 cut in two; the last global batch holds 3 real samples.
  auto outcomes = run(2, {"metrics", "11", "4", "1"});
  expect_all(outcomes, "metrics ok");
  // print() writes on the main process only.
  EXPECT_NE(outcomes[0].output.find("metrics printed once"), std::string::npos);
  EXPECT_EQ(outcomes[1].output.find("metrics printed once"), std::string::npos);
}

TEST_F(AcceleratorProcesses, ResumingMidEpochReachesTheUninterruptedParameters) {
  const std::string project = dir_.file("project"), fresh = dir_.file("fresh");
  // 2 processes, accumulation 2, 24 micro-steps (2.4 epochs); the first run saves at 4, 8, 12
  // and 14 (mid-epoch) and stops; total_limit 2 keeps the last two.
  expect_all(run(2, {"train", project, dir_.file("unused"), "24", "14", "0"}), "stopped at micro-step 14 with 2 checkpoints");
  const std::string root = project + "/checkpoints";
  std::vector<std::string> kept;
  for (const auto& e : std::filesystem::directory_iterator(root)) kept.push_back(e.path().filename().string());
  std::sort(kept.begin(), kept.end());
  EXPECT_EQ(kept, (std::vector<std::string>{"checkpoint_2", "checkpoint_3"}));
  EXPECT_TRUE(std::filesystem::exists(root + "/checkpoint_3/random_states_1.json"));

  // Fresh processes load the latest checkpoint and finish; others run uninterrupted.
  auto resumed = run(2, {"train", project, dir_.file("resumed"), "24", "14", "1"});
  expect_all(resumed, "train ok");
  EXPECT_NE(resumed[0].output.find("at micro-step 14 (epoch 1, batch 4), counter 14"), std::string::npos)
      << resumed[0].output;
  expect_all(run(2, {"train", fresh, dir_.file("straight"), "24", "0", "0"}), "train ok");

  auto a = ember::nn::load_safetensors(dir_.file("resumed") + "/model.safetensors");
  auto b = ember::nn::load_safetensors(dir_.file("straight") + "/model.safetensors");
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_TRUE(ember::testing::all_close(t, b.at(name), 0, 1e-6)) << name;
  }
}

TEST_F(AcceleratorProcesses, AnInfGradientOnOneRankSkipsTheStepOnEveryRank) {
  // fp16 loss scaling: only rank 1 sees an inf gradient (in a parameter DDP does not reduce);
  // the scaler's all-reduced found-inf flag makes both ranks skip, back off and stay identical.
  auto outcomes = run(2, {"amp"});
  expect_all(outcomes, "amp ok");
  for (size_t r = 0; r < outcomes.size(); ++r)
    EXPECT_NE(outcomes[r].output.find("skipped 1 of 2 steps, scale 512"), std::string::npos) << outcomes[r].output;
  // One process: its own inf skips its step.
  expect_all(run(0, {"amp"}), "amp ok");
  // FULL_SHARD on 3 ranks: the inf is in the last rank's gradient shard only.
  expect_all(run(3, {"amp_sharded"}), "amp sharded ok");
}

TEST_F(AcceleratorProcesses, CollectivesOnStructuresSeedsAndSavePretrainedOnTwoRanks) {
  // Tuples, vectors and Batches through every collective; padding along one dim while the
  // others differ; a drawn shuffle seed agreed across ranks seeded differently; save_pretrained
  // written once; print's spacing; a bf16 prepared model under DDP.
  auto outcomes = run(2, {"structures", dir_.file("two")});
  expect_all(outcomes, "structures ok");
  EXPECT_NE(outcomes[0].output.find("Process 0 of 2 prints once"), std::string::npos) << outcomes[0].output;
  EXPECT_EQ(outcomes[1].output.find("prints once"), std::string::npos) << outcomes[1].output;
  EXPECT_FALSE(std::filesystem::exists(dir_.file("two/bert_of_process_1")));
  EXPECT_TRUE(std::filesystem::exists(dir_.file("two/bert_of_process_0/model.safetensors")));
  auto one = run(0, {"structures", dir_.file("one")});
  expect_all(one, "structures ok");
  EXPECT_NE(one[0].output.find("Process 0 of 1 prints once"), std::string::npos) << one[0].output;
}

TEST_F(AcceleratorProcesses, RunsUnderTheEmberLauncher) {
  const std::string cli = ember_cli();
  if (!std::filesystem::exists(cli)) GTEST_SKIP() << "no `ember` command at " << cli;
  const std::string log = dir_.file("launch.log");
  const pid_t pid = spawn({cli, "launch", "--num_processes", "2", "--main_process_port", std::to_string(free_port()),
                           "--gradient_accumulation_steps", "1", "--cpu", worker(), "ddp", "3", "2"},
                          {}, log);
  auto outcome = wait_all({pid}, {log});
  EXPECT_EQ(outcome[0].exit_code, 0) << outcome[0].output;
  EXPECT_NE(outcome[0].output.find("rank 0 ddp: max abs diff"), std::string::npos) << outcome[0].output;
  EXPECT_NE(outcome[0].output.find("rank 1 ddp: max abs diff"), std::string::npos) << outcome[0].output;
}

TEST_F(AcceleratorProcesses, ShardsUnderTheEmberLauncherWithUseFsdp) {
  const std::string cli = ember_cli();
  if (!std::filesystem::exists(cli)) GTEST_SKIP() << "no `ember` command at " << cli;
  const std::string log = dir_.file("launch.log");
  // The worker leaves AcceleratorOptions::fsdp unset: the flags reach it as EMBER_FSDP_*.
  const pid_t pid = spawn({cli, "launch", "--num_processes", "2", "--main_process_port", std::to_string(free_port()),
                           "--cpu", "--use_fsdp", "--fsdp_sharding_strategy", "SHARD_GRAD_OP",
                           "--fsdp_transformer_layer_cls_to_wrap", "Linear", worker(), "fsdp", "launcher", "3", "2",
                           dir_.file("ckpt")},
                          {}, log);
  auto outcome = wait_all({pid}, {log});
  EXPECT_EQ(outcome[0].exit_code, 0) << outcome[0].output;
  for (const char* line : {"rank 0 fsdp launcher", "rank 1 fsdp launcher", "[rank 0] fsdp ok", "[rank 1] fsdp ok"})
    EXPECT_NE(outcome[0].output.find(line), std::string::npos) << line << " in\n" << outcome[0].output;
}

}  // namespace
