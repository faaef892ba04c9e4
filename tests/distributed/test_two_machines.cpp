// Two machines on one host: two Linux network namespaces joined by a veth pair, each running
// `ember launch --num_machines 2` with two ranks, so the four ranks meet over a real (virtual)
// network link rather than loopback: data-parallel training, and elastic restarts that both
// machines' launchers take together (a rank killed on machine 1; machine 1 never coming back).
// Needs root and iproute2 (CI runs as root and installs it); skips otherwise.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include "process_test_util.h"
#include "test_util.h"

namespace {

using ember::testing::env_or;

// Runs a command line, returning its exit status (output to `log`).
int run_command(const std::vector<std::string>& args, const std::string& log) {
  const pid_t pid = ember::testing::spawn_logged(args, log);
  return WEXITSTATUS(ember::testing::reap_all({pid}, std::chrono::seconds(20))[0].status);
}

std::string find_ip() {
  for (const char* dir : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"})
    if (std::filesystem::exists(dir)) return dir;
  return "";
}

class TwoMachines : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
    ip_ = find_ip();
    if (ip_.empty()) GTEST_SKIP() << "iproute2 (`ip`) is not installed";
    const std::string tag = std::to_string(::getpid() % 100000);
    ns_[0] = "ember_m0_" + tag;
    ns_[1] = "ember_m1_" + tag;
    const std::string veth0 = "ev0_" + tag, veth1 = "ev1_" + tag;
    // A /24 per test process, so parallel runs of this test never share addresses.
    const std::string net = "10.213." + std::to_string(::getpid() % 250) + ".";
    addr_[0] = net + "1";
    addr_[1] = net + "2";
    const std::string log = dir_.file("setup.log");
    const std::vector<std::vector<std::string>> steps = {
        {ip_, "netns", "add", ns_[0]},
        {ip_, "netns", "add", ns_[1]},
        {ip_, "link", "add", veth0, "type", "veth", "peer", "name", veth1},
        {ip_, "link", "set", veth0, "netns", ns_[0]},
        {ip_, "link", "set", veth1, "netns", ns_[1]},
        {ip_, "-n", ns_[0], "addr", "add", addr_[0] + "/24", "dev", veth0},
        {ip_, "-n", ns_[1], "addr", "add", addr_[1] + "/24", "dev", veth1},
        {ip_, "-n", ns_[0], "link", "set", veth0, "up"},
        {ip_, "-n", ns_[1], "link", "set", veth1, "up"},
        {ip_, "-n", ns_[0], "link", "set", "lo", "up"},
        {ip_, "-n", ns_[1], "link", "set", "lo", "up"},
    };
    for (const auto& step : steps) {
      if (run_command(step, log) != 0) {
        const std::string why = ember::testing::read_text_file(log);
        TearDown();
        GTEST_SKIP() << "cannot build the two-namespace network here: " << why;
      }
      created_ = true;
    }
  }

  void TearDown() override {
    if (!created_) return;
    for (const auto& ns : ns_) run_command({ip_, "netns", "del", ns}, dir_.file("teardown.log"));
    created_ = false;
  }

  // Starts `ember launch` on machine `machine` of two (two ranks each) with `program_and_args`.
  pid_t launch_on(int machine, const std::string& port, const std::vector<std::string>& launch_flags,
                  const std::vector<std::string>& program_and_args, const std::string& log) {
    std::vector<std::string> args = {ip_, "netns", "exec", ns_[machine], env_or("EMBER_CLI", EMBER_CLI), "launch",
                                     "--num_machines", "2", "--machine_rank", std::to_string(machine),
                                     "--num_processes", "4", "--main_process_ip", addr_[0], "--main_process_port", port,
                                     "--num_cpu_threads_per_process", "1", "--cpu"};
    args.insert(args.end(), launch_flags.begin(), launch_flags.end());
    args.insert(args.end(), program_and_args.begin(), program_and_args.end());
    return ember::testing::spawn_logged(args, log, ember::testing::environment_with(
                                                       {{"EMBER_CONFIG_FILE", dir_.file("no_such_config.yaml")}}));
  }

  struct JobRun {
    int status[2] = {-1, -1};  // each launcher's exit status; -1: killed or hung
    std::string log[2];
  };

  // elastic_worker (tests/programs) on both machines; `worker_flags` kill or stop its ranks.
  JobRun elastic_job(const std::string& name, const std::vector<std::string>& launch_flags,
                     const std::vector<std::string>& worker_flags, std::chrono::seconds deadline) {
    const std::string worker = env_or("EMBER_TEST_PROGRAMS", EMBER_TEST_PROGRAMS) + "/elastic_worker";
    std::vector<std::string> program = {worker, dir_.file(name + "_project"), dir_.file(name + ".weights")};
    program.insert(program.end(), worker_flags.begin(), worker_flags.end());
    const std::string port = std::to_string(ember::testing::free_port());
    std::vector<pid_t> pids;
    for (int machine = 0; machine < 2; ++machine)
      pids.push_back(launch_on(machine, port, launch_flags, program,
                               dir_.file(name + "_machine" + std::to_string(machine) + ".log")));
    return finish(name, pids, deadline);
  }

  JobRun finish(const std::string& name, const std::vector<pid_t>& pids, std::chrono::seconds deadline) {
    const auto reaped = ember::testing::reap_all(pids, deadline);
    JobRun run;
    for (int machine = 0; machine < 2; ++machine) {
      run.log[machine] = ember::testing::read_text_file(dir_.file(name + "_machine" + std::to_string(machine) + ".log"));
      const auto& r = reaped[size_t(machine)];
      if (!r.killed && WIFEXITED(r.status)) run.status[machine] = WEXITSTATUS(r.status);
    }
    return run;
  }

  ember::testing::TempDir dir_{"two_machines"};
  std::string ip_;
  std::string ns_[2], addr_[2];
  bool created_ = false;
};

TEST_F(TwoMachines, FourRanksOnTwoMachinesMatchOneProcessOnTheConcatenatedBatch) {
  const std::string worker = env_or("EMBER_TEST_PROGRAMS", EMBER_TEST_PROGRAMS) + "/accel_worker";
  const std::string port = std::to_string(ember::testing::free_port());
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  for (int machine = 0; machine < 2; ++machine) {
    logs.push_back(dir_.file("machine" + std::to_string(machine) + ".log"));
    pids.push_back(launch_on(machine, port, {}, {worker, "ddp", "3", "2"}, logs.back()));
  }
  const auto reaped = ember::testing::reap_all(pids, std::chrono::seconds(90));
  std::string all;
  for (int machine = 0; machine < 2; ++machine) {
    const std::string out = ember::testing::read_text_file(logs[size_t(machine)]);
    all += "--- machine " + std::to_string(machine) + "\n" + out;
    EXPECT_FALSE(reaped[size_t(machine)].killed) << "machine " << machine << " hung";
    EXPECT_TRUE(WIFEXITED(reaped[size_t(machine)].status) && WEXITSTATUS(reaped[size_t(machine)].status) == 0);
  }
  // Ranks 0-1 run on machine 0, ranks 2-3 on machine 1; each checked its parameters against a
  // single process trained on all four ranks' batches.
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_NE(all.find("rank " + std::to_string(rank) + " ddp: max abs diff"), std::string::npos)
        << "rank " << rank << " did not report\n" << all;
  EXPECT_EQ(all.find("FAILED"), std::string::npos) << all;
  EXPECT_NE(all.find("ddp ok"), std::string::npos) << all;
  if (std::getenv("EMBER_TEST_VERBOSE")) std::printf("%s", all.c_str());
}

bool contains(const std::string& text, const std::string& fragment) { return text.find(fragment) != std::string::npos; }

TEST_F(TwoMachines, ARankKilledOnMachineOneRestartsBothMachinesToTheWeightsOfAnUninterruptedRun) {
  // The same job uninterrupted, over the same link, gives the weights to reach.
  const JobRun reference = elastic_job("reference", {"--max_restarts", "2"}, {}, std::chrono::seconds(90));
  ASSERT_EQ(reference.status[0], 0) << reference.log[0] << reference.log[1];
  ASSERT_EQ(reference.status[1], 0) << reference.log[1];
  const std::string want = ember::testing::read_text_file(dir_.file("reference.weights"));
  ASSERT_GT(want.size(), 100u);

  // Rank 2 (machine 1) dies after backward pass 7, then again after pass 15 of the first restart.
  const JobRun r = elastic_job("killed", {"--max_restarts", "2", "--rdzv_timeout", "60"},
                               {"--kill", "2:0:7", "--kill", "3:1:15"}, std::chrono::seconds(150));
  const std::string both = "--- machine 0\n" + r.log[0] + "--- machine 1\n" + r.log[1];
  ASSERT_EQ(r.status[0], 0) << both;
  ASSERT_EQ(r.status[1], 0) << both;
  EXPECT_EQ(ember::testing::read_text_file(dir_.file("killed.weights")), want) << both;
  for (int machine = 0; machine < 2; ++machine) {
    EXPECT_TRUE(contains(r.log[machine], "restarting every rank (restart 1 of 2)")) << both;
    EXPECT_TRUE(contains(r.log[machine], "restarting every rank (restart 2 of 2)")) << both;
    EXPECT_TRUE(contains(r.log[machine], "attempt 3: every rank succeeded")) << both;
  }
  EXPECT_TRUE(contains(r.log[1], "attempt 1: rank 2 was killed by SIGKILL")) << both;
  EXPECT_TRUE(contains(r.log[1], "attempt 2: rank 3 was killed by SIGKILL")) << both;
  // Every rank of both machines resumed each restart from a checkpoint, not from the start.
  for (int rank = 0; rank < 4; ++rank)
    for (int restart = 1; restart <= 2; ++restart)
      EXPECT_TRUE(contains(r.log[rank / 2], "[rank " + std::to_string(rank) + "] rank " + std::to_string(rank) +
                                                " restart " + std::to_string(restart) + " resumed from '" +
                                                dir_.file("killed_project") + "/checkpoints/checkpoint_"))
          << both;
}

TEST_F(TwoMachines, AMachineThatDoesNotComeBackEndsTheJobNamingIt) {
  // Rank 2 stops itself after pass 3; then machine 1's launcher is killed outright (its ranks
  // die with it). Machine 0's ranks fail, and its launcher waits --rdzv_timeout for machine 1.
  const std::string pid_file = dir_.file("stopped.pid");
  const std::string worker = env_or("EMBER_TEST_PROGRAMS", EMBER_TEST_PROGRAMS) + "/elastic_worker";
  const std::vector<std::string> program = {worker, dir_.file("gone_project"), dir_.file("gone.weights"), "--stop",
                                            "2:3:" + pid_file};
  const std::string port = std::to_string(ember::testing::free_port());
  const std::vector<std::string> flags = {"--max_restarts", "2", "--rdzv_timeout", "4"};
  std::vector<pid_t> pids = {launch_on(0, port, flags, program, dir_.file("gone_machine0.log")),
                             launch_on(1, port, flags, program, dir_.file("gone_machine1.log"))};
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (ember::testing::read_text_file(pid_file).empty() && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_FALSE(ember::testing::read_text_file(pid_file).empty()) << "rank 2 never stopped";
  ::kill(pids[1], SIGKILL);
  const auto started = std::chrono::steady_clock::now();
  const JobRun r = finish("gone", pids, std::chrono::seconds(60));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_NE(r.status[0], 0) << r.log[0];
  EXPECT_NE(r.status[0], -1) << "machine 0's launcher hung\n" << r.log[0];
  EXPECT_TRUE(contains(r.log[0], "machine 1 did not come back within 4 s (--rdzv_timeout)")) << r.log[0];
  EXPECT_FALSE(contains(r.log[0], "restart 1 of 2")) << r.log[0];
  EXPECT_LT(seconds, 40.0) << r.log[0];
}

}  // namespace
