// Two machines on one host: two Linux network namespaces joined by a veth pair, each running
// `ember launch --num_machines 2` with two ranks, so the four ranks meet over a real (virtual)
// network link rather than loopback. Needs root and iproute2 (CI runs as root and installs it);
// skips otherwise.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

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

  ember::testing::TempDir dir_{"two_machines"};
  std::string ip_;
  std::string ns_[2], addr_[2];
  bool created_ = false;
};

TEST_F(TwoMachines, FourRanksOnTwoMachinesMatchOneProcessOnTheConcatenatedBatch) {
  const std::string cli = env_or("EMBER_CLI", EMBER_CLI);
  const std::string worker = env_or("EMBER_TEST_PROGRAMS", EMBER_TEST_PROGRAMS) + "/accel_worker";
  const std::string port = std::to_string(ember::testing::free_port());
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  for (int machine = 0; machine < 2; ++machine) {
    logs.push_back(dir_.file("machine" + std::to_string(machine) + ".log"));
    pids.push_back(ember::testing::spawn_logged(
        {ip_, "netns", "exec", ns_[machine], cli, "launch", "--num_machines", "2", "--machine_rank",
         std::to_string(machine), "--num_processes", "4", "--main_process_ip", addr_[0], "--main_process_port", port,
         "--num_cpu_threads_per_process", "1", "--cpu", worker, "ddp", "3", "2"},
        logs.back()));
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

}  // namespace
