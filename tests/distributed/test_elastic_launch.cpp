// Elastic restarts under `ember launch --max_restarts` with real processes
// (tests/programs/elastic_worker: automatic checkpoints every 2 optimizer steps, load_state()
// at the top): ranks killed at random steps resume from the latest checkpoint and end with
// weights bit-identical to an uninterrupted run; too many failures end the job with the last
// failure's status and a summary of every attempt; a stopped rank is named by the monitor, and
// with --heartbeat_timeout it fails the attempt and the job restarts.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "process_test_util.h"
#include "test_util.h"

namespace {

using ember::testing::env_or;
using ember::testing::TempDir;

constexpr auto kDeadline = std::chrono::seconds(120);

std::string worker() { return env_or("EMBER_TEST_PROGRAMS", EMBER_TEST_PROGRAMS) + "/elastic_worker"; }

struct LaunchResult {
  int status = -1;  // the launcher's exit status; -1: killed at the deadline or by a signal
  std::string log;  // its stdout and stderr
};

std::vector<std::string> launch_args(const std::vector<std::string>& launch_flags, const std::string& project,
                                     const std::string& weights, const std::vector<std::string>& worker_flags) {
  std::vector<std::string> args = {env_or("EMBER_CLI", EMBER_CLI), "launch", "--num_processes", "2", "--cpu",
                                   "--num_cpu_threads_per_process", "1", "--main_process_port",
                                   std::to_string(ember::testing::free_port())};
  args.insert(args.end(), launch_flags.begin(), launch_flags.end());
  args.insert(args.end(), {worker(), project, weights});
  args.insert(args.end(), worker_flags.begin(), worker_flags.end());
  return args;
}

std::vector<std::string> launch_env(const TempDir& dir) {
  return ember::testing::environment_with({{"EMBER_CONFIG_FILE", dir.file("no_such_config.yaml")}});
}

LaunchResult finish(pid_t pid, const std::string& log) {
  const auto reaped = ember::testing::reap_all({pid}, kDeadline);
  LaunchResult out;
  out.log = ember::testing::read_text_file(log);
  if (!reaped[0].killed && WIFEXITED(reaped[0].status)) out.status = WEXITSTATUS(reaped[0].status);
  return out;
}

LaunchResult launch(const TempDir& dir, const std::string& name, const std::vector<std::string>& launch_flags,
                    const std::vector<std::string>& worker_flags = {}) {
  const std::string log = dir.file(name + ".log");
  const pid_t pid = ember::testing::spawn_logged(
      launch_args(launch_flags, dir.file(name + "_project"), dir.file(name + ".weights"), worker_flags), log,
      launch_env(dir));
  return finish(pid, log);
}

bool contains(const std::string& text, const std::string& fragment) { return text.find(fragment) != std::string::npos; }

// The weights of an uninterrupted run, made once per test program.
const std::string& reference_weights(const TempDir& dir) {
  static const std::string weights = [&] {
    const LaunchResult r = launch(dir, "reference", {});
    EXPECT_EQ(r.status, 0) << r.log;
    const std::string bytes = ember::testing::read_text_file(dir.file("reference.weights"));
    EXPECT_GT(bytes.size(), 100u) << r.log;
    return bytes;
  }();
  return weights;
}

TEST(ElasticLaunch, RanksKilledAtRandomStepsResumeToTheWeightsOfAnUninterruptedRun) {
  TempDir dir("elastic_random_kills");
  const std::string& want = reference_weights(dir);
  // Two failures at random backward passes of 24 (a checkpoint every 4): the second after the
  // first, so the resumed attempt reaches it; each resumes from an earlier checkpoint (or none).
  std::random_device device;
  const unsigned seed = device();
  std::mt19937 gen(seed);
  const int first = std::uniform_int_distribution<int>(2, 20)(gen);
  const int second = std::uniform_int_distribution<int>(first + 1, 23)(gen);
  SCOPED_TRACE("rank 1 killed after pass " + std::to_string(first) + ", then rank 0 after pass " +
               std::to_string(second) + " (seed " + std::to_string(seed) + ")");
  const LaunchResult r = launch(dir, "killed", {"--max_restarts", "3"},
                                {"--kill", "1:0:" + std::to_string(first), "--kill", "0:1:" + std::to_string(second)});
  ASSERT_EQ(r.status, 0) << r.log;
  EXPECT_EQ(ember::testing::read_text_file(dir.file("killed.weights")), want) << r.log;
  EXPECT_TRUE(contains(r.log, "restarting every rank (restart 1 of 3)")) << r.log;
  EXPECT_TRUE(contains(r.log, "restarting every rank (restart 2 of 3)")) << r.log;
  EXPECT_FALSE(contains(r.log, "restart 3 of 3")) << r.log;
  EXPECT_TRUE(contains(r.log, "summary of 3 attempts (2 restarts of at most 3)")) << r.log;
  EXPECT_TRUE(contains(r.log, "attempt 1: rank 1 was killed by SIGKILL at step " + std::to_string(first))) << r.log;
  EXPECT_TRUE(contains(r.log, "attempt 2: rank 0 was killed by SIGKILL at step " + std::to_string(second))) << r.log;
  EXPECT_TRUE(contains(r.log, "attempt 3: every rank succeeded")) << r.log;
  // Each restart resumed from the latest checkpoint before its failure: one every 4 passes, the
  // one due at the failing pass never written (the rank died first).
  for (const auto& [restart, failed_at] : {std::pair{1, first}, std::pair{2, second}}) {
    const int resumed = (failed_at - 1) / 4 * 4;
    const std::string expected =
        "restart " + std::to_string(restart) + " resumed from '" +
        (resumed == 0 ? std::string() : dir.file("killed_project") + "/checkpoints/checkpoint_" + std::to_string(resumed / 4 - 1)) +
        "' at pass " + std::to_string(resumed);
    EXPECT_TRUE(contains(r.log, "[rank 0] rank 0 " + expected)) << expected << "\n" << r.log;
    EXPECT_TRUE(contains(r.log, "[rank 1] rank 1 " + expected)) << expected << "\n" << r.log;
  }
  // The restart latency, as the summary reports it.
  const std::regex latency(R"(attempt (\d): .*started ([0-9.]+) s after the previous failure, training again after ([0-9.]+) s)");
  int measured = 0;
  for (std::sregex_iterator it(r.log.begin(), r.log.end(), latency), end; it != end; ++it, ++measured) {
    const double started = std::stod((*it)[2]), training = std::stod((*it)[3]);
    EXPECT_LE(started, training);
    EXPECT_LT(training, 30.0) << r.log;
    std::cout << "attempt " << (*it)[1] << ": restarted " << started << " s, training again " << training
              << " s after the failure\n";
  }
  EXPECT_EQ(measured, 2) << r.log;
}

TEST(ElasticLaunch, TooManyFailuresEndWithTheLastStatusAndASummaryOfEveryAttempt) {
  TempDir dir("elastic_give_up");
  const LaunchResult r = launch(dir, "failing", {"--max_restarts", "3"},
                                {"--kill", "1:0:3", "--kill", "1:1:7", "--kill", "0:2:10", "--kill", "1:3:13"});
  EXPECT_EQ(r.status, 128 + SIGKILL) << r.log;
  EXPECT_TRUE(contains(r.log, "restarting every rank (restart 3 of 3)")) << r.log;
  EXPECT_TRUE(contains(r.log, "summary of 4 attempts (3 restarts of at most 3)")) << r.log;
  EXPECT_TRUE(contains(r.log, "attempt 1: rank 1 was killed by SIGKILL at step 3")) << r.log;
  EXPECT_TRUE(contains(r.log, "attempt 2: rank 1 was killed by SIGKILL at step 7")) << r.log;
  EXPECT_TRUE(contains(r.log, "attempt 3: rank 0 was killed by SIGKILL at step 10")) << r.log;
  EXPECT_TRUE(contains(r.log, "attempt 4: rank 1 was killed by SIGKILL at step 13")) << r.log;
  EXPECT_TRUE(contains(r.log, "giving up: the job failed 4 times; exit status 137 is the last failure's")) << r.log;
  EXPECT_FALSE(contains(r.log, "elastic done")) << r.log;
}

TEST(ElasticLaunch, WithoutMaxRestartsAFailedRankEndsTheJobAtOnce) {
  TempDir dir("elastic_no_restarts");
  const LaunchResult r = launch(dir, "once", {}, {"--kill", "1:0:5"});
  EXPECT_EQ(r.status, 128 + SIGKILL) << r.log;
  EXPECT_FALSE(contains(r.log, "restarting")) << r.log;
  EXPECT_FALSE(contains(r.log, "summary")) << r.log;
  EXPECT_TRUE(contains(r.log, "rank 1 was killed by SIGKILL")) << r.log;
}

// Waits until `path` exists with a pid in it; 0 at the deadline.
pid_t wait_for_pid(const std::string& path, const std::string& log, const std::string& also_in_log) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < until) {
    std::ifstream in(path);
    pid_t pid = 0;
    if (in >> pid && pid > 0 && contains(ember::testing::read_text_file(log), also_in_log)) return pid;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return 0;
}

TEST(ElasticLaunch, TheMonitorNamesAStoppedRankAndTheJobGoesOnOnceItContinues) {
  TempDir dir("elastic_stopped");
  const std::string& want = reference_weights(dir);
  const std::string log = dir.file("stopped.log"), pid_file = dir.file("stopped.pid");
  const pid_t launcher = ember::testing::spawn_logged(
      launch_args({"--monitor_interval", "0.5"}, dir.file("stopped_project"), dir.file("stopped.weights"),
                  {"--stop", "1:6:" + pid_file}),
      log, launch_env(dir));
  const pid_t stopped = wait_for_pid(pid_file, log, "rank 1 is stopped (SIGSTOP or a debugger)");
  ASSERT_GT(stopped, 0) << ember::testing::read_text_file(log);
  ::kill(stopped, SIGCONT);
  const LaunchResult r = finish(launcher, log);
  ASSERT_EQ(r.status, 0) << r.log;
  // Rank 0 waits for it in the all-reduce of pass 8, so it may be named too.
  static const std::regex warning(
      R"(ember launch: warning: no progress for 0\.5 s from ranks? (0 \(step 8\), )?1 \(step 6\); rank 1 is stopped)");
  EXPECT_TRUE(std::regex_search(r.log, warning)) << r.log;
  EXPECT_EQ(ember::testing::read_text_file(dir.file("stopped.weights")), want) << r.log;
}

TEST(ElasticLaunch, AHeartbeatTimeoutFailsAStoppedRankAndTheJobRestarts) {
  TempDir dir("elastic_heartbeat");
  const std::string& want = reference_weights(dir);
  const LaunchResult r = launch(dir, "hung", {"--max_restarts", "1", "--monitor_interval", "0.5", "--heartbeat_timeout", "2"},
                                {"--stop", "1:6:" + dir.file("hung.pid")});
  ASSERT_EQ(r.status, 0) << r.log;
  EXPECT_TRUE(contains(r.log, "rank 1 made no progress for 2 s (--heartbeat_timeout; it is stopped); stopping the ranks"))
      << r.log;
  EXPECT_TRUE(contains(r.log, "attempt 1: rank 1 lost its heartbeat (stopped by the launcher) at step 6")) << r.log;
  EXPECT_TRUE(contains(r.log, "attempt 2: every rank succeeded")) << r.log;
  EXPECT_EQ(ember::testing::read_text_file(dir.file("hung.weights")), want) << r.log;
}

TEST(ElasticLaunch, BadRestartFlagsAreUsageErrors) {
  TempDir dir("elastic_flags");
  for (const auto& [flags, message] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--max_restarts", "-1"}, "--max_restarts"},
           {{"--monitor_interval", "0"}, "--monitor_interval: expected a positive number of seconds, got '0'"},
           {{"--heartbeat_timeout", "soon"}, "--heartbeat_timeout: expected a non-negative number of seconds"},
           {{"--rdzv_timeout", "-3"}, "--rdzv_timeout: expected a positive number of seconds"}}) {
    const LaunchResult r = launch(dir, "flags", flags);
    EXPECT_NE(r.status, 0) << r.log;
    EXPECT_TRUE(contains(r.log, message)) << message << "\n" << r.log;
    EXPECT_FALSE(contains(r.log, "elastic done")) << r.log;
  }
}

}  // namespace
