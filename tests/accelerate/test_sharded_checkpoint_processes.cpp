// Sharded checkpoints over real processes: saved by 4 processes under FULL_SHARD (and by 2 under
// DDP), loaded under another world size and strategy, into DDP and into one process, merged by
// `ember merge-weights`, and refused with a clear error when a shard file is damaged; under
// FULL_STATE_DICT saved as one whole model and optimizer file.
#include <chrono>
#include <filesystem>
#include <map>
#include <optional>

#include "nn/io/safetensors.h"
#include "process_test_util.h"
#include "test_util.h"

namespace {

using ember::testing::env_or;
namespace fs = std::filesystem;

std::string worker() { return env_or("EMBER_TEST_PROGRAMS", EMBER_TEST_PROGRAMS) + "/reshard_worker"; }
std::string ember_cli() { return env_or("EMBER_CLI", EMBER_CLI); }

using Outcome = ember::testing::ChildOutcome;

class ShardedCheckpointProcesses : public ::testing::Test {
 protected:
  std::vector<Outcome> run(int world, const std::vector<std::string>& args) {
    std::vector<std::string> argv = {worker()};
    argv.insert(argv.end(), args.begin(), args.end());
    const std::map<std::string, std::optional<std::string>> env = {{"EMBER_USE_CPU", "1"},
                                                                   {"EMBER_MIXED_PRECISION", std::nullopt},
                                                                   {"EMBER_USE_FSDP", std::nullopt},
                                                                   {"EMBER_GRADIENT_ACCUMULATION_STEPS", std::nullopt}};
    const std::string logs = dir_.file("run" + std::to_string(runs_++) + "_rank");
    return ember::testing::run_loopback_job(argv, world, logs, env, std::chrono::seconds(120));
  }

  static void expect_all(const std::vector<Outcome>& outcomes, const std::string& marker, const std::string& what) {
    for (size_t r = 0; r < outcomes.size(); ++r) {
      EXPECT_EQ(outcomes[r].exit_code, 0) << what << ", rank " << r << ":\n" << outcomes[r].output;
      EXPECT_NE(outcomes[r].output.find(marker), std::string::npos) << what << ", rank " << r << ":\n"
                                                                     << outcomes[r].output;
    }
  }

  ember::testing::TempDir dir_{"sharded_checkpoint"};
  int runs_ = 0;
};

TEST_F(ShardedCheckpointProcesses, SavedByFourUnderFullShardLoadsUnderAnySplit) {
  const std::string dir = dir_.file("full_shard_4");
  fs::create_directories(dir);
  expect_all(run(4, {"save", "FULL_SHARD", dir}), "save ok", "save on 4");
  // Every process wrote its pieces; there is no whole model file.
  for (int r = 0; r < 4; ++r) {
    const std::string tail = ".shard-0000" + std::to_string(r) + "-of-00004.safetensors";
    EXPECT_TRUE(fs::exists(dir + "/ckpt/model" + tail)) << tail;
    EXPECT_TRUE(fs::exists(dir + "/ckpt/optimizer" + tail)) << tail;
  }
  EXPECT_FALSE(fs::exists(dir + "/ckpt/model.safetensors"));

  expect_all(run(4, {"load", "FULL_SHARD", dir, "1"}), "load ok", "4 ranks, FULL_SHARD");
  expect_all(run(2, {"load", "SHARD_GRAD_OP", dir, "0"}), "load ok", "2 ranks, SHARD_GRAD_OP");
  expect_all(run(3, {"load", "FULL_SHARD", dir, "0"}), "load ok", "3 ranks, FULL_SHARD");
  expect_all(run(3, {"load", "SHARD_OPTIMIZER", dir, "0"}), "load ok", "3 ranks, SHARD_OPTIMIZER");
  expect_all(run(2, {"load", "DDP", dir, "0"}), "load ok", "2 ranks, DDP");
  expect_all(run(1, {"load", "DDP", dir, "0"}), "load ok", "1 process");

  // merge-weights: the whole model, bit for bit what the saving job held.
  const std::string merged = dir_.file("merged");
  const std::string log = dir_.file("merge.log");
  const pid_t pid = ember::testing::spawn_logged({ember_cli(), "merge-weights", dir + "/ckpt", merged}, log);
  const auto merge = ember::testing::collect_outcomes({pid}, {log}, std::chrono::seconds(60));
  ASSERT_EQ(merge[0].exit_code, 0) << merge[0].output;
  const auto b = ember::nn::load_safetensors(dir + "/saved.safetensors");
  // save_model under FULL_SHARD gathered the same whole model.
  for (const std::string& file : {merged + "/model.safetensors", dir + "/saved_model/model.safetensors"}) {
    const auto a = ember::nn::load_safetensors(file);
    ASSERT_EQ(a.size(), b.size()) << file;
    for (const auto& [name, t] : b) {
      ASSERT_TRUE(a.count(name)) << file << ": " << name;
      EXPECT_EQ(a.at(name).to_vector<float>(), t.to_vector<float>()) << file << ": " << name;
    }
  }
}

TEST_F(ShardedCheckpointProcesses, SavedByDdpLoadsIntoFullShard) {
  const std::string dir = dir_.file("ddp_2");
  fs::create_directories(dir);
  expect_all(run(2, {"save", "DDP", dir}), "save ok", "save on 2 under DDP");
  EXPECT_TRUE(fs::exists(dir + "/ckpt/model.safetensors"));
  expect_all(run(3, {"load", "FULL_SHARD", dir, "0"}), "load ok", "3 ranks, FULL_SHARD");
  expect_all(run(2, {"load", "DDP", dir, "1"}), "load ok", "2 ranks, DDP");
}

TEST_F(ShardedCheckpointProcesses, FullStateDictSavesOneWholeModelAndOptimizerFile) {
  const std::string dir = dir_.file("full_state_3");
  fs::create_directories(dir);
  expect_all(run(3, {"save", "FULL_SHARD:FULL", dir}), "save ok", "save on 3, FULL_STATE_DICT");
  EXPECT_TRUE(fs::exists(dir + "/ckpt/model.safetensors"));
  EXPECT_TRUE(fs::exists(dir + "/ckpt/optimizer.safetensors"));
  for (const auto& entry : fs::directory_iterator(dir + "/ckpt"))
    EXPECT_EQ(entry.path().filename().string().find(".shard-"), std::string::npos) << entry.path();
  // The saved model is the whole one the job held, and the optimizer's state has whole shapes.
  const auto model = ember::nn::load_safetensors(dir + "/ckpt/model.safetensors");
  const auto held = ember::nn::load_safetensors(dir + "/saved.safetensors");
  for (const auto& [name, t] : held) {
    ASSERT_TRUE(model.count(name)) << name;
    EXPECT_EQ(model.at(name).to_vector<float>(), t.to_vector<float>()) << name;
  }
  for (const auto& [key, t] : ember::nn::load_safetensors(dir + "/ckpt/optimizer.safetensors"))
    EXPECT_GE(t.dim(), 1) << key;
  expect_all(run(3, {"load", "FULL_SHARD:FULL", dir, "1"}), "load ok", "3 ranks, FULL_SHARD");
  expect_all(run(2, {"load", "SHARD_GRAD_OP", dir, "0"}), "load ok", "2 ranks, SHARD_GRAD_OP");
  expect_all(run(1, {"load", "DDP", dir, "0"}), "load ok", "1 process");
}

TEST_F(ShardedCheckpointProcesses, ADamagedShardFileIsRefusedByEveryProcessNamingIt) {
  const std::string dir = dir_.file("damaged");
  fs::create_directories(dir);
  expect_all(run(4, {"save", "FULL_SHARD", dir}), "save ok", "save on 4");
  const std::string shard = dir + "/ckpt/optimizer.shard-00002-of-00004.safetensors";
  fs::resize_file(shard, fs::file_size(shard) - 16);
  const auto outcomes = run(2, {"refuse", "SHARD_GRAD_OP", dir});
  expect_all(outcomes, "refuse ok", "truncated optimizer shard");
  for (const auto& o : outcomes) EXPECT_NE(o.output.find("optimizer.shard-00002-of-00004.safetensors"), std::string::npos) << o.output;

  fs::remove(dir + "/ckpt/model.shard-00003-of-00004.safetensors");
  const auto missing = run(2, {"refuse", "FULL_SHARD", dir});
  expect_all(missing, "refuse ok", "missing model shard");
  for (const auto& o : missing) EXPECT_NE(o.output.find("model.shard-00003-of-00004.safetensors"), std::string::npos) << o.output;
}

}  // namespace
