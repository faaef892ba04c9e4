// Faults a training job must survive or report clearly, with real processes where the fault is
// a process going away: a rank SIGKILLed mid all-reduce and the master (rank 0, the store
// server) exiting while the others wait, each under `ember launch` or alone; the rendezvous port
// already taken; SIGKILL in the middle of save_state and a full disk (RLIMIT_FSIZE) during it;
// and non-finite losses (AcceleratorOptions::check_finite_loss).
// Covered elsewhere, not repeated here: a killed / exited / stuck rank and a rank that never
// arrives at the process-group level (test_process_group_gloo.cpp), the busy port and missing
// ranks of the rendezvous (test_rendezvous.cpp), malformed and oversized store messages, the
// bind address and the store server going away (test_tcp_store.cpp), a save that fails midway
// and loading another model or world size (test_accelerator.cpp), launcher exit statuses
// (test_launch.cpp).
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "accelerate/accelerator.h"
#include "ddp_test_model.h"
#include "optim/sgd_adam.h"
#include "process_test_util.h"
#include "test_util.h"

namespace ember::distributed {
namespace {

using namespace std::chrono;
using testing::env_or;
using testing::environment_with;
using testing::free_port;
using testing::read_text_file;
using testing::spawn_logged;

std::string worker() { return env_or("EMBER_TEST_PROGRAMS", EMBER_TEST_PROGRAMS) + "/fault_worker"; }
std::string cli() { return env_or("EMBER_CLI", EMBER_CLI); }
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

struct Outcome {
  int status = -1;  // exit status, 128 + signal, or -2 when it had to be killed at the deadline
  double seconds = 0;
  std::string out;
};

// Runs one process to completion (killed at `deadline`).
Outcome run(const std::vector<std::string>& args, const std::string& log, seconds deadline = seconds(30),
            const std::vector<std::string>& env = environment_with({})) {
  const auto t0 = steady_clock::now();
  const pid_t pid = spawn_logged(args, log, env);
  const auto r = testing::reap_all({pid}, deadline)[0];
  Outcome o;
  o.seconds = duration<double>(steady_clock::now() - t0).count();
  o.status = r.killed ? -2 : WIFEXITED(r.status) ? WEXITSTATUS(r.status) : 128 + WTERMSIG(r.status);
  o.out = read_text_file(log);
  return o;
}

std::vector<std::string> rank_env(int rank, int world, int port) {
  return environment_with({{"MASTER_ADDR", "127.0.0.1"},
                           {"MASTER_PORT", std::to_string(port)},
                           {"RANK", std::to_string(rank)},
                           {"WORLD_SIZE", std::to_string(world)},
                           {"LOCAL_RANK", std::to_string(rank)},
                           {"LOCAL_WORLD_SIZE", std::to_string(world)}});
}

// ---- processes going away

TEST(Faults, MasterExitingWhileOthersWaitFailsEverySurvivorWithinTheTimeout) {
  // World 3, rank 2 never arrives; rank 0 (the store server) exits while rank 1 waits.
  testing::TempDir dir("faults_master");
  const int port = free_port();
  const auto t0 = steady_clock::now();
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r)
    pids.push_back(spawn_logged({worker(), "collective", "master_dies", "4000"},
                                dir.file("rank" + std::to_string(r)), rank_env(r, 3, port)));
  const auto reaped = testing::reap_all(pids, seconds(20));
  const double took = duration<double>(steady_clock::now() - t0).count();
  const std::string out = read_text_file(dir.file("rank1"));
  ASSERT_FALSE(reaped[1].killed) << out;
  EXPECT_TRUE(WIFEXITED(reaped[1].status) && WEXITSTATUS(reaped[1].status) == 3) << out;
  EXPECT_TRUE(contains(out, "ERROR: ")) << out;
  EXPECT_LT(took, 4.0 + 6.0) << out;  // the timeout plus start-up on a loaded machine
}

TEST(Faults, RankKilledMidAllreduceUnderTheLauncherFailsTheLaunch) {
  testing::TempDir dir("faults_kill");
  const Outcome o = run({cli(), "launch", "--num_processes", "3", "--main_process_port", std::to_string(free_port()),
                         worker(), "collective", "kill_mid_allreduce", "3000"},
                        dir.file("launch.log"));
  ASSERT_NE(o.status, -2) << o.out;
  EXPECT_NE(o.status, 0) << o.out;
  EXPECT_TRUE(contains(o.out, "rank 1")) << o.out;
  EXPECT_LT(o.seconds, 20.0) << o.out;
}

TEST(Faults, MasterExitingUnderTheLauncherFailsTheLaunch) {
  testing::TempDir dir("faults_master_launch");
  // Rank 0 (the store server) exits with status 0 at the rendezvous: rank 1 fails, and so does the launch.
  const Outcome o = run({cli(), "launch", "--num_processes", "2", "--main_process_port", std::to_string(free_port()),
                         worker(), "collective", "master_dies", "3000"},
                        dir.file("launch.log"));
  ASSERT_NE(o.status, -2) << o.out;
  EXPECT_NE(o.status, 0) << o.out;
  EXPECT_TRUE(contains(o.out, "ERROR: ")) << o.out;
  EXPECT_LT(o.seconds, 20.0) << o.out;
}

TEST(Faults, TakenRendezvousPortFailsTheLaunchNamingThePort) {
  // Something else listens on the master port.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string port = std::to_string(ntohs(addr.sin_port));
  testing::TempDir dir("faults_port");
  const Outcome o = run({cli(), "launch", "--num_processes", "2", "--main_process_port", port, worker(), "collective",
                         "ok", "3000"},
                        dir.file("launch.log"));
  ::close(fd);
  ASSERT_NE(o.status, -2) << o.out;
  EXPECT_NE(o.status, 0) << o.out;
  EXPECT_TRUE(contains(o.out, "already in use")) << o.out;
  EXPECT_TRUE(contains(o.out, port)) << o.out;
  EXPECT_LT(o.seconds, 20.0) << o.out;
}

// ---- checkpoints

TEST(Faults, SigkillDuringSaveStateLeavesALoadableCheckpoint) {
  testing::TempDir dir("faults_save_kill");
  const std::string ckpt = dir.file("ckpt");
  std::mt19937 gen{uint32_t(ember::testing::test_seed())};
  std::uniform_int_distribution<int> delay_ms(0, 150);
  int killed_after = 0;
  for (int round = 0; round < 4; ++round) {
    const std::string log = dir.file("save" + std::to_string(round));
    const pid_t pid = spawn_logged({worker(), "save_loop", ckpt}, log);
    // Wait for one complete save in this round, then kill at a random moment.
    const auto until = steady_clock::now() + seconds(20);
    while (!contains(read_text_file(log), "SAVED 1") && steady_clock::now() < until)
      std::this_thread::sleep_for(milliseconds(5));
    std::this_thread::sleep_for(milliseconds(delay_ms(gen)));
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    const std::string out = read_text_file(log);
    ASSERT_TRUE(contains(out, "SAVED 1")) << out;
    ++killed_after;
    const Outcome load = run({worker(), "load", ckpt}, dir.file("load" + std::to_string(round)));
    EXPECT_EQ(load.status, 0) << "round " << round << ":\n" << load.out << "\nsaver:\n" << out;
    EXPECT_TRUE(contains(load.out, "LOADED ")) << load.out;
  }
  EXPECT_EQ(killed_after, 4);
}

TEST(Faults, SaveKilledBetweenTheReplacingRenamesLeavesALoadableCheckpoint) {
  // Where the filesystem cannot exchange two directories, save_state replaces a checkpoint by
  // two renames; a kill between them leaves it as ".ckpt.old" next to a half-written ".ckpt.tmp".
  testing::TempDir dir("faults_save_window");
  const std::string ckpt = dir.file("ckpt");
  const std::string log = dir.file("save0");
  const pid_t pid = spawn_logged({worker(), "save_loop", ckpt}, log);
  const auto until = steady_clock::now() + seconds(20);
  while (!contains(read_text_file(log), "SAVED 2") && steady_clock::now() < until)
    std::this_thread::sleep_for(milliseconds(5));
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  ASSERT_TRUE(contains(read_text_file(log), "SAVED 2"));
  std::filesystem::remove_all(dir.file(".ckpt.old"));
  std::filesystem::rename(ckpt, dir.file(".ckpt.old"));
  std::filesystem::create_directories(dir.file(".ckpt.tmp"));
  const Outcome load = run({worker(), "load", ckpt}, dir.file("load0"));
  EXPECT_EQ(load.status, 0) << load.out;
  EXPECT_TRUE(contains(load.out, "LOADED ")) << load.out;
  // The next save puts the old checkpoint back before replacing it.
  const Outcome full = run({worker(), "disk_full", ckpt, "65536"}, dir.file("save1"));
  EXPECT_EQ(full.status, 3) << full.out;
  EXPECT_TRUE(std::filesystem::is_directory(ckpt));
  EXPECT_FALSE(std::filesystem::exists(dir.file(".ckpt.old")));
  const Outcome again = run({worker(), "load", ckpt}, dir.file("load1"));
  EXPECT_TRUE(contains(again.out, "LOADED 1")) << again.out;
}

TEST(Faults, FullDiskDuringSaveStateIsReportedAndKeepsThePreviousCheckpoint) {
  testing::TempDir dir("faults_disk_full");
  const std::string ckpt = dir.file("ckpt");
  // 64 KiB: the model, optimizer and generator files fit, the 8 MB custom object does not.
  const Outcome o = run({worker(), "disk_full", ckpt, "65536"}, dir.file("full.log"));
  EXPECT_EQ(o.status, 3) << o.out;
  EXPECT_TRUE(contains(o.out, "SAVED 1")) << o.out;
  EXPECT_TRUE(contains(o.out, "ERROR: ")) << o.out;
  EXPECT_TRUE(contains(o.out, "custom_checkpoint.safetensors")) << o.out;  // index 0 has no suffix
  EXPECT_TRUE(contains(o.out, "File too large") || contains(o.out, "No space")) << o.out;
  // Nothing of the failed save is left next to the checkpoint it kept.
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"ckpt", "full.log"}));
  EXPECT_FALSE(std::filesystem::exists(dir.file(".ckpt.tmp")));
  const Outcome load = run({worker(), "load", ckpt}, dir.file("load.log"));
  EXPECT_EQ(load.status, 0) << load.out;
  EXPECT_TRUE(contains(load.out, "LOADED 1")) << load.out;

  // A first save that fails leaves nothing at all (64 KiB again; SIGXFSZ ignored across exec).
  testing::TempDir fresh("faults_disk_full_first");
  const Outcome first = run({"/bin/bash", "-c", "trap '' XFSZ; ulimit -f 64; exec \"$0\" save_loop \"$1\"", worker(),
                             fresh.file("ckpt")},
                            fresh.file("full.log"));
  EXPECT_EQ(first.status, 3) << first.out;
  EXPECT_FALSE(contains(first.out, "SAVED")) << first.out;
  EXPECT_TRUE(contains(first.out, "custom_checkpoint.safetensors")) << first.out;
  EXPECT_FALSE(std::filesystem::exists(fresh.file("ckpt")));
  EXPECT_FALSE(std::filesystem::exists(fresh.file(".ckpt.tmp")));
}

// ---- non-finite losses

struct LossRun {
  Accelerator acc;
  std::shared_ptr<ddp_test::Mlp> model = ddp_test::make_mlp(2);
  optim::AdamW opt{model->parameters(), {}};
  explicit LossRun(const std::string& check) : acc(AcceleratorOptions{.cpu = true, .check_finite_loss = check}) {
    acc.prepare(model, opt);
  }
  // A finite loss plus `extra` (0, nan, inf or -inf).
  Tensor loss(double extra) { return sum(model->forward(ddp_test::uniform_tensor(5, {4, ddp_test::kIn}))) + extra; }
};

TEST(Faults, NonFiniteLossIsReportedWithTheStepAndCanStopTraining) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  {
    LossRun r("error");
    r.acc.backward(r.loss(0.0));
    r.acc.backward(r.loss(0.0));
    const auto grads = r.model->parameters()[0].grad().to_vector<float>();
    EXPECT_EMBER_ERROR(r.acc.backward(r.loss(nan)), "Accelerator::backward", "non-finite loss (nan) at step 3");
    EXPECT_EQ(r.model->parameters()[0].grad().to_vector<float>(), grads) << "no gradient from a bad loss";
    EXPECT_EMBER_ERROR(r.acc.backward_token_sum(r.loss(-inf), 4), "Accelerator::backward_token_sum",
                       "non-finite loss (-inf) at step 4");
    EXPECT_EQ(r.acc.nonfinite_losses(), 2);
  }
  {
    LossRun r("warn");
    r.acc.backward(r.loss(0.0));
    ::testing::internal::CaptureStderr();
    r.acc.backward(r.loss(inf));
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_TRUE(contains(err, "non-finite loss (inf) at step 2")) << err;
    EXPECT_EQ(r.acc.nonfinite_losses(), 1);
  }
  {
    LossRun r("no");  // the default: no check, no host sync
    EXPECT_NO_THROW(r.acc.backward(r.loss(nan)));
    EXPECT_EQ(r.acc.nonfinite_losses(), 0);
  }
  EXPECT_EMBER_ERROR(LossRun("sometimes"), "check_finite_loss", "'sometimes'");
}

}  // namespace
}  // namespace ember::distributed
