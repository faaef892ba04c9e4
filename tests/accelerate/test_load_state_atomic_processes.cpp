// load_state on two real processes over loopback (tests/programs/load_state_worker): one rank's
// bad file fails the load on both ranks, and neither rank changes.
#include <chrono>
#include <map>
#include <optional>

#include "process_test_util.h"
#include "test_util.h"

namespace {

using ember::testing::env_or;

constexpr auto kDeadline = std::chrono::seconds(60);

TEST(LoadStateAtomicProcesses, OneRanksBadFileFailsTheLoadOnEveryRankAndChangesNothing) {
  ember::testing::TempDir dir("load_state_atomic_processes");
  const std::string worker = env_or("EMBER_TEST_PROGRAMS", EMBER_TEST_PROGRAMS) + "/load_state_worker";
  const std::string port = std::to_string(ember::testing::free_port());
  constexpr int kWorld = 2;
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  for (int r = 0; r < kWorld; ++r) {
    std::map<std::string, std::optional<std::string>> env = {
        {"RANK", std::to_string(r)},          {"WORLD_SIZE", std::to_string(kWorld)},
        {"LOCAL_RANK", std::to_string(r)},    {"LOCAL_WORLD_SIZE", std::to_string(kWorld)},
        {"MASTER_ADDR", "127.0.0.1"},         {"MASTER_PORT", port},
        {"EMBER_USE_CPU", "1"},               {"EMBER_MIXED_PRECISION", std::nullopt},
        {"EMBER_GRADIENT_ACCUMULATION_STEPS", std::nullopt}};
    logs.push_back(dir.file("rank" + std::to_string(r) + ".log"));
    pids.push_back(ember::testing::spawn_logged({worker, dir.path()}, logs.back(), ember::testing::environment_with(env)));
  }
  const auto reaped = ember::testing::reap_all(pids, kDeadline);
  for (int r = 0; r < kWorld; ++r) {
    const std::string out = ember::testing::read_text_file(logs[size_t(r)]);
    EXPECT_FALSE(reaped[size_t(r)].killed) << "rank " << r << " passed the deadline:\n" << out;
    EXPECT_TRUE(WIFEXITED(reaped[size_t(r)].status) && WEXITSTATUS(reaped[size_t(r)].status) == 0)
        << "rank " << r << ":\n" << out;
    EXPECT_NE(out.find("atomic ok"), std::string::npos) << "rank " << r << ":\n" << out;
  }
}

}  // namespace
