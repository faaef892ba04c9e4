// The `ember` command run as a real process: `ember launch` on tests/programs/launch_target with
// 1, 2 and 4 ranks (environment, prefixed output, failures, signals, config files), requests
// beyond the machine's process and open-file limits, 48 ranks stopping at once, and
// `ember config`, `ember env` and the usage texts. Every process runs under a deadline.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "accelerate/launch_config.h"
#include "distributed/rendezvous.h"
#include "process_test_util.h"
#include "test_util.h"

namespace ember::distributed {
namespace {

using Clock = std::chrono::steady_clock;
using ember::testing::TempDir;
using ember::testing::env_or;
using ember::testing::free_port;

std::string ember_cli() { return env_or("EMBER_CLI", EMBER_CLI); }
std::string target_program() { return env_or("EMBER_TEST_PROGRAMS", EMBER_TEST_PROGRAMS) + "/launch_target"; }

struct Result {
  int status = -1;  // exit code, or 128 + signal
  std::string out, err;
  double seconds = 0;
  bool timed_out = false;
};

// A child process with its stdout and stderr captured, killed (with its process group) if it
// outlives its deadline or the test.
class Child {
 public:
  Child(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env_overrides,
        const std::string& input = "")
      : start_(Clock::now()) {
    const std::vector<std::string> env_strings =
        ember::testing::environment_with({env_overrides.begin(), env_overrides.end()});
    std::vector<char*> args = ember::testing::c_strings(argv), envp = ember::testing::c_strings(env_strings);

    int out[2], err[2], in[2];
    if (::pipe2(out, O_CLOEXEC) || ::pipe2(err, O_CLOEXEC) || ::pipe2(in, O_CLOEXEC)) {
      ADD_FAILURE() << "pipe: " << std::strerror(errno);
      return;
    }
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      ::execve(args[0], args.data(), envp.data());
      ::_exit(126);
    }
    ::setpgid(pid_, pid_);
    ::close(out[1]);
    ::close(err[1]);
    ::close(in[0]);
    [[maybe_unused]] ssize_t n = ::write(in[1], input.data(), input.size());  // small: fits the pipe
    ::close(in[1]);
    out_fd_ = out[0];
    err_fd_ = err[0];
  }

  ~Child() {
    if (pid_ > 0 && !reaped_) {
      ::kill(-pid_, SIGKILL);
      int status;
      ::waitpid(pid_, &status, 0);
    }
    if (out_fd_ >= 0) ::close(out_fd_);
    if (err_fd_ >= 0) ::close(err_fd_);
  }

  pid_t pid() const { return pid_; }
  const std::string& out() const { return result_.out; }

  // Reads output until `done(stdout so far)` holds; false at the deadline or end of output.
  bool read_until(const std::function<bool(const std::string&)>& done, std::chrono::seconds limit) {
    const auto deadline = Clock::now() + limit;
    while (!done(result_.out)) {
      if (Clock::now() >= deadline || (out_fd_ < 0 && err_fd_ < 0)) return false;
      pump(deadline);
    }
    return true;
  }

  // Reads everything and waits for the exit; at the deadline the process group is killed.
  Result wait(std::chrono::seconds limit = std::chrono::seconds(60)) {
    const auto deadline = Clock::now() + limit;
    while (out_fd_ >= 0 || err_fd_ >= 0) {
      if (Clock::now() >= deadline) {
        result_.timed_out = true;
        ::kill(-pid_, SIGKILL);
        break;
      }
      pump(deadline);
    }
    int status = 0;
    for (;;) {
      const pid_t got = ::waitpid(pid_, &status, WNOHANG);
      if (got == pid_) break;
      if (Clock::now() >= deadline && !result_.timed_out) {
        result_.timed_out = true;
        ::kill(-pid_, SIGKILL);
      }
      ::usleep(2000);
    }
    reaped_ = true;
    result_.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    result_.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    return result_;
  }

 private:
  void pump(Clock::time_point deadline) {
    pollfd fds[2];
    int n = 0;
    if (out_fd_ >= 0) fds[n++] = {out_fd_, POLLIN, 0};
    if (err_fd_ >= 0) fds[n++] = {err_fd_, POLLIN, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    ::poll(fds, nfds_t(n), int(std::clamp<long long>(left, 0, 200)));
    for (int i = 0; i < n; ++i) {
      if (!fds[i].revents) continue;
      int& fd = fds[i].fd == out_fd_ ? out_fd_ : err_fd_;
      std::string& sink = fds[i].fd == out_fd_ ? result_.out : result_.err;
      char buffer[65536];
      const ssize_t got = ::read(fd, buffer, sizeof(buffer));
      if (got > 0) {
        sink.append(buffer, size_t(got));
      } else if (got == 0 || errno != EINTR) {
        ::close(fd);
        fd = -1;
      }
    }
  }

  pid_t pid_ = -1;
  bool reaped_ = false;
  int out_fd_ = -1, err_fd_ = -1;
  Clock::time_point start_;
  Result result_;
};

// Each test gets its own config location, so a user's ~/.config/ember never leaks in.
class LaunchTest : public ::testing::Test {
 protected:
  TempDir dir_{"ember_launch_test"};

  std::map<std::string, std::string> base_env() const {
    return {{"EMBER_CONFIG_FILE", dir_.file("no_such_config.yaml")}};
  }

  Result ember(const std::vector<std::string>& args, std::map<std::string, std::string> env = {},
               const std::string& input = "") {
    auto full_env = base_env();
    for (const auto& [k, v] : env) full_env[k] = v;
    std::vector<std::string> argv = {ember_cli()};
    argv.insert(argv.end(), args.begin(), args.end());
    Child child(argv, full_env, input);
    return child.wait();
  }

  // `ember launch FLAGS... launch_target ACTIONS...`
  Result launch(const std::vector<std::string>& flags, const std::vector<std::string>& actions,
                std::map<std::string, std::string> env = {}) {
    std::vector<std::string> args = {"launch"};
    args.insert(args.end(), flags.begin(), flags.end());
    args.push_back(target_program());
    args.insert(args.end(), actions.begin(), actions.end());
    return ember(args, std::move(env));
  }
};

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// rank -> variable -> value, from "[rank R] ENV NAME=value" lines.
std::map<int, std::map<std::string, std::string>> rank_envs(const std::string& out) {
  static const std::regex pattern(R"(^\[rank (\d+)\] ENV ([A-Z_]+)=(.*)$)");
  std::map<int, std::map<std::string, std::string>> envs;
  for (const std::string& line : split_lines(out)) {
    std::smatch m;
    if (std::regex_match(line, m, pattern)) envs[std::stoi(m[1])][m[2]] = m[3];
  }
  return envs;
}

std::string describe(const Result& r) {
  return "status " + std::to_string(r.status) + (r.timed_out ? " (timed out)" : "") + "\nstdout:\n" +
         r.out.substr(0, 4000) + "\nstderr:\n" + r.err.substr(0, 4000);
}

bool contains(const std::string& text, const std::string& fragment) { return text.find(fragment) != std::string::npos; }

bool process_gone(pid_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

// --- usage ------------------------------------------------------------------------------

TEST_F(LaunchTest, HelpAndUsageErrors) {
  Result r = ember({"--help"});
  EXPECT_EQ(r.status, 0) << describe(r);
  for (const char* cmd : {"launch", "config", "env"}) EXPECT_TRUE(contains(r.out, cmd)) << r.out;

  r = ember({"launch", "--help"});
  EXPECT_EQ(r.status, 0) << describe(r);
  for (const char* flag : {"--num_processes", "--num_machines", "--machine_rank", "--main_process_ip",
                           "--main_process_port", "--mixed_precision", "--gradient_accumulation_steps",
                           "--num_cpu_threads_per_process", "--config_file", "--cpu", "--use_fsdp",
                           "--fsdp_sharding_strategy", "--fsdp_auto_wrap_policy", "--fsdp_transformer_layer_cls_to_wrap",
                           "--fsdp_min_num_params", "--fsdp_reshard_after_forward", "--fsdp_forward_prefetch",
                           "--fsdp_backward_prefetch", "--fsdp_activation_checkpointing", "--fsdp_state_dict_type",
                           "--fsdp_reduce_dtype", "--fsdp_param_dtype"})
    EXPECT_TRUE(contains(r.out, flag)) << flag;

  r = ember({"frobnicate"});
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.err, "unknown command 'frobnicate'")) << r.err;
  EXPECT_TRUE(contains(r.err, "usage: ember")) << r.err;

  r = ember({"launch", "--num_procs", "2", target_program()});
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.err, "unknown option '--num_procs'")) << r.err;
  EXPECT_TRUE(contains(r.err, "usage: ember launch")) << r.err;

  r = ember({"launch"});
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.err, "no PROGRAM")) << r.err;

  r = ember({"launch", "--num_processes", "two", target_program()});
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.err, "--num_processes")) << r.err;
  EXPECT_TRUE(contains(r.err, "'two'")) << r.err;

  r = ember({"launch", "--mixed_precision", "fp8", target_program()});
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.err, "fp8")) << r.err;

  r = ember({"launch", "--num_processes"});
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.err, "needs a value")) << r.err;

  r = ember({"config", "--bogus"});
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.err, "usage: ember config")) << r.err;

  r = ember({"env", "extra"});
  EXPECT_NE(r.status, 0);
}

TEST_F(LaunchTest, MissingProgramIsAClearError) {
  Result r = launch({}, {});
  ASSERT_EQ(r.status, 0) << describe(r);  // the target itself works

  r = ember({"launch", "--num_processes", "2", dir_.file("not_there")});
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.err, "not_there")) << r.err;
  EXPECT_TRUE(contains(r.err, "does not exist")) << r.err;

  r = ember({"launch", "ember_no_such_program_anywhere"});
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.err, "cannot find program 'ember_no_such_program_anywhere'")) << r.err;

  // A directory is not a program.
  r = ember({"launch", dir_.path()});
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.err, "not an executable")) << r.err;
}

// --- environment ------------------------------------------------------------------------

TEST_F(LaunchTest, SingleProcessStillGetsTheEnvironment) {
  const Result r = launch({}, {"--print-env"});
  ASSERT_EQ(r.status, 0) << describe(r);
  auto envs = rank_envs(r.out);
  ASSERT_EQ(envs.size(), 1u) << r.out;
  auto& e = envs[0];
  EXPECT_EQ(e["RANK"], "0");
  EXPECT_EQ(e["WORLD_SIZE"], "1");
  EXPECT_EQ(e["LOCAL_RANK"], "0");
  EXPECT_EQ(e["LOCAL_WORLD_SIZE"], "1");
  EXPECT_EQ(e["MASTER_ADDR"], "127.0.0.1");
  EXPECT_EQ(e["MASTER_PORT"], "29500");
  EXPECT_EQ(e["EMBER_MIXED_PRECISION"], "no");
  EXPECT_EQ(e["EMBER_GRADIENT_ACCUMULATION_STEPS"], "1");
  EXPECT_EQ(e["EMBER_USE_CPU"], "0");
  EXPECT_EQ(e["EMBER_NUM_THREADS"], std::to_string(available_cpus()));
  EXPECT_EQ(e["OMP_NUM_THREADS"], std::to_string(available_cpus()));
}

TEST_F(LaunchTest, EveryRankGetsItsEnvironment) {
  for (int n : {2, 4}) {
    SCOPED_TRACE(std::to_string(n) + " processes");
    const int port = free_port();
    // Inherited launch variables are replaced, not kept.
    const Result r = launch({"--num_processes", std::to_string(n), "--main_process_port", std::to_string(port),
                             "--mixed_precision", "bf16", "--gradient_accumulation_steps", "4", "--cpu"},
                            {"--print-env"}, {{"RANK", "99"}, {"WORLD_SIZE", "99"}});
    ASSERT_EQ(r.status, 0) << describe(r);
    auto envs = rank_envs(r.out);
    ASSERT_EQ(int(envs.size()), n) << r.out;
    for (int rank = 0; rank < n; ++rank) {
      auto& e = envs[rank];
      EXPECT_EQ(e["RANK"], std::to_string(rank));
      EXPECT_EQ(e["LOCAL_RANK"], std::to_string(rank));
      EXPECT_EQ(e["WORLD_SIZE"], std::to_string(n));
      EXPECT_EQ(e["LOCAL_WORLD_SIZE"], std::to_string(n));
      EXPECT_EQ(e["GROUP_RANK"], "0");
      EXPECT_EQ(e["MASTER_ADDR"], "127.0.0.1");
      EXPECT_EQ(e["MASTER_PORT"], std::to_string(port));
      EXPECT_EQ(e["EMBER_MIXED_PRECISION"], "bf16");
      EXPECT_EQ(e["EMBER_GRADIENT_ACCUMULATION_STEPS"], "4");
      EXPECT_EQ(e["EMBER_USE_CPU"], "1");
      const std::string threads = std::to_string(std::max(1, available_cpus() / n));
      EXPECT_EQ(e["EMBER_NUM_THREADS"], threads);
      EXPECT_EQ(e["OMP_NUM_THREADS"], threads);
    }
  }
}

TEST_F(LaunchTest, EveryRankGetsTheFsdpEnvironment) {
  const int port = free_port();
  // A sharding variable left in the launcher's own environment is not passed on.
  const Result r = launch({"--num_processes", "2", "--main_process_port", std::to_string(port), "--cpu", "--use_fsdp",
                           "--fsdp_sharding_strategy", "SHARD_GRAD_OP", "--fsdp_transformer_layer_cls_to_wrap",
                           "BertLayer,BertPooler", "--fsdp-reduce-dtype=bf16"},
                          {"--print-env"}, {{"EMBER_FSDP_RESHARD_AFTER_FORWARD", "true"}});
  ASSERT_EQ(r.status, 0) << describe(r);
  auto envs = rank_envs(r.out);
  ASSERT_EQ(envs.size(), 2u) << r.out;
  for (auto& [rank, e] : envs) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_EQ(e["EMBER_USE_FSDP"], "true");
    EXPECT_EQ(e["EMBER_FSDP_SHARDING_STRATEGY"], "SHARD_GRAD_OP");
    EXPECT_EQ(e["EMBER_FSDP_AUTO_WRAP_POLICY"], "TRANSFORMER_BASED_WRAP");
    EXPECT_EQ(e["EMBER_FSDP_TRANSFORMER_CLS_TO_WRAP"], "BertLayer,BertPooler");
    EXPECT_EQ(e["EMBER_FSDP_REDUCE_DTYPE"], "bf16");
    EXPECT_EQ(e["EMBER_FSDP_BACKWARD_PREFETCH"], "BACKWARD_PRE");
    EXPECT_EQ(e.count("EMBER_FSDP_RESHARD_AFTER_FORWARD"), 0u) << "inherited from the launcher";
  }

  // Without --use_fsdp the ranks are told so, whatever the launcher inherited.
  const Result off = launch({"--num_processes", "2", "--main_process_port", std::to_string(free_port()), "--cpu"},
                            {"--print-env"}, {{"EMBER_USE_FSDP", "true"}});
  ASSERT_EQ(off.status, 0) << describe(off);
  for (auto& [rank, e] : rank_envs(off.out)) EXPECT_EQ(e["EMBER_USE_FSDP"], "false") << rank;

  // Strategies are names; Accelerate's numbers are refused before any rank starts.
  const Result number = launch({"--num_processes", "2", "--use_fsdp", "--fsdp_sharding_strategy", "2"}, {"--echo", "x"});
  EXPECT_EQ(number.status, 2) << describe(number);
  EXPECT_FALSE(contains(number.out, "[rank")) << describe(number);
  EXPECT_TRUE(contains(number.err, "--fsdp_sharding_strategy")) << number.err;
  EXPECT_TRUE(contains(number.err, "give the name, not a number")) << number.err;
  const Result policy = launch({"--fsdp_auto_wrap_policy", "BY_SIZE"}, {});
  EXPECT_EQ(policy.status, 2) << describe(policy);
  EXPECT_TRUE(contains(policy.err, "'BY_SIZE'")) << policy.err;
  EXPECT_TRUE(contains(policy.err, "SIZE_BASED_WRAP")) << policy.err;
}

TEST_F(LaunchTest, FsdpFlagsOverrideTheConfigFile) {
  LaunchConfig c;
  c.num_processes = 2;
  c.use_cpu = true;
  c.main_process_port = free_port();
  FSDPOptions fsdp;
  fsdp.sharding_strategy = ShardingStrategy::SHARD_OPTIMIZER;
  fsdp.transformer_layer_cls_to_wrap = {"BertLayer"};
  fsdp.activation_checkpointing = true;
  c.fsdp = fsdp;
  const std::string path = dir_.file("fsdp.yaml");
  c.save_yaml(path);

  Result r = launch({"--config_file", path, "--fsdp_sharding_strategy", "NO_SHARD"}, {"--print-env"});
  ASSERT_EQ(r.status, 0) << describe(r);
  auto envs = rank_envs(r.out);
  ASSERT_EQ(envs.size(), 2u) << r.out;
  for (auto& [rank, e] : envs) {
    EXPECT_EQ(e["EMBER_USE_FSDP"], "true");
    EXPECT_EQ(e["EMBER_FSDP_SHARDING_STRATEGY"], "NO_SHARD");            // the flag
    EXPECT_EQ(e["EMBER_FSDP_TRANSFORMER_CLS_TO_WRAP"], "BertLayer");     // the file
    EXPECT_EQ(e["EMBER_FSDP_ACTIVATION_CHECKPOINTING"], "true");         // the file
  }
}

// Machine 1 of 2 with 4 ranks: its ranks are 2 and 3, and they meet machine 0 at `master`.
void expect_machine_one_of_two(std::map<int, std::map<std::string, std::string>>& envs, const std::string& master) {
  for (int local = 0; local < 2; ++local) {
    auto& e = envs[2 + local];
    EXPECT_EQ(e["RANK"], std::to_string(2 + local));
    EXPECT_EQ(e["LOCAL_RANK"], std::to_string(local));
    EXPECT_EQ(e["WORLD_SIZE"], "4");
    EXPECT_EQ(e["LOCAL_WORLD_SIZE"], "2");
    EXPECT_EQ(e["GROUP_RANK"], "1");
    EXPECT_EQ(e["MASTER_ADDR"], master);
  }
}

TEST_F(LaunchTest, MachineRankOffsetsTheRanks) {
  const Result r = launch({"--num_processes", "4", "--num_machines", "2", "--machine_rank", "1", "--main_process_ip",
                           "10.1.2.3", "--num_cpu_threads_per_process", "3"},
                          {"--print-env"});
  ASSERT_EQ(r.status, 0) << describe(r);
  auto envs = rank_envs(r.out);
  ASSERT_EQ(envs.size(), 2u) << r.out;
  expect_machine_one_of_two(envs, "10.1.2.3");
  for (int local = 0; local < 2; ++local) {
    auto& e = envs[2 + local];
    EXPECT_EQ(e["EMBER_NUM_THREADS"], "3");
    EXPECT_EQ(e["OMP_NUM_THREADS"], "3");
  }
}

// Under `srun --ntasks-per-node=1 ember launch` (an sbatch script's way), each launcher takes
// its machine's rank, the machine count and the main machine from the step's variables.
std::map<std::string, std::string> srun_task_env(int node, int nodes) {
  return {{"SLURM_STEP_ID", "0"},
          {"SLURM_JOB_ID", "4321"},
          {"SLURM_PROCID", std::to_string(node)},
          {"SLURM_NTASKS", std::to_string(nodes)},
          {"SLURM_LOCALID", "0"},
          {"SLURM_NODEID", std::to_string(node)},
          {"SLURM_STEP_TASKS_PER_NODE", "1(x" + std::to_string(nodes) + ")"},
          {"SLURM_JOB_NODELIST", "cn[07-08]"}};
}

TEST_F(LaunchTest, UnderSrunTheMachineLayoutComesFromSlurm) {
  const Result r = launch({"--num_processes", "4"}, {"--print-env"}, srun_task_env(1, 2));
  ASSERT_EQ(r.status, 0) << describe(r);
  auto envs = rank_envs(r.out);
  ASSERT_EQ(envs.size(), 2u) << r.out;
  expect_machine_one_of_two(envs, "cn07");
  for (int local = 0; local < 2; ++local)
    EXPECT_EQ(envs[2 + local]["MASTER_PORT"], std::to_string(slurm_port_for_job(4321)));
  // Flags still win over Slurm's word.
  const Result flagged = launch({"--num_processes", "4", "--main_process_ip", "10.0.0.9", "--main_process_port",
                                 "29511"},
                                {"--print-env"}, srun_task_env(1, 2));
  ASSERT_EQ(flagged.status, 0) << describe(flagged);
  EXPECT_EQ(rank_envs(flagged.out)[2]["MASTER_ADDR"], "10.0.0.9");
  EXPECT_EQ(rank_envs(flagged.out)[2]["MASTER_PORT"], "29511");
}

TEST_F(LaunchTest, TwoLaunchersOnOneSlurmNodeAreRejected) {
  auto env = srun_task_env(0, 1);
  env["SLURM_NTASKS"] = "2";
  env["SLURM_PROCID"] = "1";
  env["SLURM_LOCALID"] = "1";
  env["SLURM_STEP_TASKS_PER_NODE"] = "2";
  const Result r = launch({"--num_processes", "2"}, {"--print-env"}, env);
  EXPECT_NE(r.status, 0) << describe(r);
  EXPECT_TRUE(contains(r.err, "srun --ntasks-per-node=1")) << r.err;
  EXPECT_TRUE(rank_envs(r.out).empty()) << r.out;
}

TEST_F(LaunchTest, InconsistentMachineSettingsAreRejected) {
  Result r = launch({"--num_processes", "3", "--num_machines", "2"}, {});
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.err, "split evenly")) << r.err;

  r = launch({"--num_processes", "4", "--num_machines", "2", "--machine_rank", "2"}, {});
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.err, "machine_rank")) << r.err;
  EXPECT_TRUE(contains(r.err, "not below num_machines (2)")) << r.err;
}

// --- output -----------------------------------------------------------------------------

TEST_F(LaunchTest, EveryLineIsPrefixedAndNoneIsLost) {
  constexpr int kLines = 2000, kErrLines = 500;
  static const std::regex out_pattern(R"(^\[rank (\d+)\] line (\d+) of rank (\d+) x{100}$)");
  static const std::regex err_pattern(R"(^\[rank (\d+)\] err (\d+) of rank (\d+)$)");
  for (int n : {1, 2, 4}) {
    SCOPED_TRACE(std::to_string(n) + " processes");
    const Result r = launch({"--num_processes", std::to_string(n)},
                            {"--lines", std::to_string(kLines), "--stderr-lines", std::to_string(kErrLines)});
    ASSERT_EQ(r.status, 0) << describe(r);
    for (const bool err : {false, true}) {
      std::map<int, int> next;  // rank -> next expected line number
      int bad = 0;
      for (const std::string& line : split_lines(err ? r.err : r.out)) {
        std::smatch m;
        if (!std::regex_match(line, m, err ? err_pattern : out_pattern) || m[1] != m[3]) {
          if (++bad <= 3) ADD_FAILURE() << "malformed line: " << line.substr(0, 300);
          continue;
        }
        const int rank = std::stoi(m[1]);
        EXPECT_EQ(std::stoi(m[2]), next[rank]) << "rank " << rank << " lines out of order";
        next[rank] = std::stoi(m[2]) + 1;
      }
      EXPECT_EQ(bad, 0);
      ASSERT_EQ(int(next.size()), n);
      for (int rank = 0; rank < n; ++rank) EXPECT_EQ(next[rank], err ? kErrLines : kLines) << "rank " << rank;
    }
  }
}

TEST_F(LaunchTest, PartialLastLinesAreFlushedWhole) {
  const Result r = launch({"--num_processes", "2"}, {"--echo", "first", "--partial", "no newline here"});
  ASSERT_EQ(r.status, 0) << describe(r);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string prefix = "[rank " + std::to_string(rank) + "] ";
    EXPECT_TRUE(contains(r.out, prefix + "first\n")) << r.out;
    EXPECT_TRUE(contains(r.out, prefix + "no newline here\n")) << r.out;
  }
  EXPECT_EQ(split_lines(r.out).size(), 4u) << r.out;
}

TEST_F(LaunchTest, ArgumentsAfterTheProgramBelongToIt) {
  const Result r = launch({}, {"--echo", "two words", "--echo", "--num_processes"});
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(r.out, "[rank 0] two words\n[rank 0] --num_processes\n");
}

// --- failures and signals ---------------------------------------------------------------

TEST_F(LaunchTest, FailingRankStopsTheOthersAndSetsTheStatus) {
  for (int n : {2, 4}) {
    SCOPED_TRACE(std::to_string(n) + " processes");
    const Result r = launch({"--num_processes", std::to_string(n)},
                            {"--rank", "1", "--sleep", "0.3", "--exit", "3", "--rank", "all", "--sleep", "120"});
    EXPECT_FALSE(r.timed_out);
    EXPECT_EQ(r.status, 3) << describe(r);
    EXPECT_LT(r.seconds, 20.0) << "the sleeping ranks kept the launcher alive";
    EXPECT_TRUE(contains(r.err, "ember launch: rank 1 exited with status 3; stopping the other ranks")) << r.err;
  }
}

TEST_F(LaunchTest, RanksIgnoringSigtermAreKilledAfterTheGracePeriod) {
  const Result r = launch({"--num_processes", "2"}, {"--ignore-sigterm", "--rank", "1", "--sleep", "1", "--exit", "5",
                                                     "--rank", "all", "--sleep", "120"});
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.status, 5) << describe(r);
  EXPECT_LT(r.seconds, 20.0);
  EXPECT_TRUE(contains(r.err, "SIGKILL")) << r.err;
}

TEST_F(LaunchTest, RankKilledByASignalFailsTheLaunch) {
  const Result r = launch({"--num_processes", "2"},
                          {"--rank", "1", "--sleep", "0.3", "--signal", std::to_string(SIGKILL), "--rank", "all",
                           "--sleep", "120"});
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.status, 128 + SIGKILL) << describe(r);
  EXPECT_LT(r.seconds, 20.0);
  EXPECT_TRUE(contains(r.err, "rank 1 was killed by SIGKILL")) << r.err;
  EXPECT_TRUE(contains(r.err, "rank 1 exited with status " + std::to_string(128 + SIGKILL))) << r.err;

  const Result single = launch({}, {"--signal", std::to_string(SIGTERM)});
  EXPECT_EQ(single.status, 128 + SIGTERM) << describe(single);
}

TEST_F(LaunchTest, SignalsToTheLauncherStopTheRanks) {
  for (int sig : {SIGTERM, SIGINT}) {
    SCOPED_TRACE(sigabbrev_np(sig));
    auto env = base_env();
    Child child({ember_cli(), "launch", "--num_processes", "2", target_program(), "--pid", "--sleep", "120"}, env);
    std::vector<pid_t> pids;
    const bool started = child.read_until(
        [&](const std::string& out) {
          static const std::regex pid_line(R"(\[rank \d+\] PID (\d+))");
          pids.clear();
          for (std::sregex_iterator it(out.begin(), out.end(), pid_line), end; it != end; ++it)
            pids.push_back(std::stoi((*it)[1]));
          return pids.size() == 2;
        },
        std::chrono::seconds(30));
    ASSERT_TRUE(started) << child.out();
    ::kill(child.pid(), sig);
    const Result r = child.wait(std::chrono::seconds(30));
    EXPECT_FALSE(r.timed_out);
    EXPECT_EQ(r.status, 128 + sig) << describe(r);
    EXPECT_LT(r.seconds, 20.0);
    for (pid_t pid : pids) EXPECT_TRUE(process_gone(pid)) << "rank process " << pid << " survived";
  }
}

// --- what the machine can hold ---------------------------------------------------------

// Runs `ember ARGS...` after `limits` (bash ulimit commands), as `user_prefix` says.
Result ember_under_limits(const std::vector<std::string>& user_prefix, const std::string& limits,
                          const std::vector<std::string>& args, const std::map<std::string, std::string>& env) {
  // The limits are set by a root shell, then the prefix (a change of user) runs `ember`: bash
  // itself would drop an effective user that differs from its real one.
  std::vector<std::string> argv = {"/bin/bash", "-c", limits + " && exec \"$0\" \"$@\""};
  argv.insert(argv.end(), user_prefix.begin(), user_prefix.end());
  argv.push_back(ember_cli());
  argv.insert(argv.end(), args.begin(), args.end());
  Child child(argv, env);
  return child.wait();
}

TEST_F(LaunchTest, RequestsBeyondTheMachineFailAtOnceAndStartNoRank) {
  Result r = launch({"--num_processes", "100000"}, {"--echo", "started"});
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.status, 1) << describe(r);
  EXPECT_LT(r.seconds, 5.0) << describe(r);
  EXPECT_FALSE(contains(r.out, "[rank")) << describe(r);
  EXPECT_TRUE(contains(r.err, "num_processes 100000 (100000 ranks on this machine)")) << r.err;
  EXPECT_TRUE(contains(r.err, "lower num_processes")) << r.err;

  // Over many machines only this machine's share has to fit.
  r = launch({"--num_processes", "100000", "--num_machines", "50000", "--machine_rank", "7"}, {"--print-env"});
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(rank_envs(r.out).size(), 2u) << r.out;

  // Numbers that are no number of processes.
  for (const char* bad : {"0", "-4"}) {
    r = launch({"--num_processes", bad}, {});
    EXPECT_EQ(r.status, 2) << describe(r);
    EXPECT_TRUE(contains(r.err, "--num_processes: expected a positive integer, got " + std::string(bad))) << r.err;
  }
  r = launch({"--num_processes", "99999999999"}, {});
  EXPECT_EQ(r.status, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, "--num_processes: 99999999999 is out of range")) << r.err;
}

TEST_F(LaunchTest, TheOpenFileLimitIsCheckedBeforeForking) {
  // Two pipe ends per rank: 40 ranks do not fit in 64 descriptors.
  const std::vector<std::string> args = {"launch", "--num_processes", "40", target_program(), "--echo", "started"};
  Result r = ember_under_limits({}, "ulimit -n 64", args, base_env());
  EXPECT_EQ(r.status, 1) << describe(r);
  EXPECT_LT(r.seconds, 5.0) << describe(r);
  EXPECT_FALSE(contains(r.out, "[rank")) << describe(r);
  EXPECT_TRUE(contains(r.err, "num_processes 40 (40 ranks on this machine) cannot start")) << r.err;
  EXPECT_TRUE(contains(r.err, "open-file limit (ulimit -n, RLIMIT_NOFILE) is 64")) << r.err;
  EXPECT_TRUE(contains(r.err, "the hard limit is 64, so raise that first")) << r.err;

  // The count it names is exact: that many ranks start and finish under the same limit.
  std::smatch m;
  static const std::regex most(R"(so that at most (\d+) ranks? run on this machine)");
  ASSERT_TRUE(std::regex_search(r.err, m, most)) << r.err;
  const int fitting = std::stoi(m[1]);
  ASSERT_GT(fitting, 1) << r.err;
  ASSERT_LT(fitting, 40) << r.err;
  r = ember_under_limits({}, "ulimit -n 64",
                         {"launch", "--num_processes", std::to_string(fitting), target_program(), "--echo", "started"},
                         base_env());
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(int(split_lines(r.out).size()), fitting) << r.out;
  r = ember_under_limits({}, "ulimit -n 64",
                         {"launch", "--num_processes", std::to_string(fitting + 1), target_program()}, base_env());
  EXPECT_EQ(r.status, 1) << describe(r);
  EXPECT_TRUE(contains(r.err, "open-file limit")) << r.err;
}

TEST_F(LaunchTest, TheProcessLimitIsCheckedBeforeForking) {
  // The kernel does not hold root to RLIMIT_NPROC, and neither does the launcher. As root, the
  // launcher runs with the real user nobody (the user the limit is counted for) and no
  // capabilities, but keeps the effective user root, so it still reaches a checkout that only
  // root may read (a clone under /root).
  std::vector<std::string> as_user;
  if (::getuid() == 0)
    as_user = {"/usr/bin/setpriv", "--ruid=65534", "--inh-caps=-all", "--bounding-set=-all", "--"};
  const Result r = ember_under_limits(
      as_user, "ulimit -u 4", {"launch", "--num_processes", "8", target_program(), "--echo", "started"}, base_env());
  EXPECT_EQ(r.status, 1) << describe(r);
  EXPECT_LT(r.seconds, 5.0) << describe(r);
  EXPECT_FALSE(contains(r.out, "[rank")) << describe(r);
  EXPECT_TRUE(contains(r.err, "num_processes 8 (8 ranks on this machine) cannot start")) << r.err;
  EXPECT_TRUE(contains(r.err, "process limit (ulimit -u, RLIMIT_NPROC) is 4")) << r.err;
  EXPECT_TRUE(contains(r.err, "ulimit -u N")) << r.err;
}

TEST_F(LaunchTest, ManyRanksStopQuicklyWhenOneFails) {
  // The last rank started fails at once; the 47 others sleep until stopped.
  Result r = launch({"--num_processes", "48"}, {"--rank", "47", "--exit", "4", "--rank", "all", "--sleep", "120"});
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.status, 4) << describe(r);
  EXPECT_LT(r.seconds, 20.0) << describe(r);
  EXPECT_TRUE(contains(r.err, "rank 47 exited with status 4; stopping the other ranks")) << r.err;

  // The first fails while the others are still being started: no more are started.
  r = launch({"--num_processes", "48"}, {"--rank", "0", "--exit", "4", "--rank", "all", "--pid", "--sleep", "120"});
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.status, 4) << describe(r);
  EXPECT_LT(r.seconds, 20.0) << describe(r);
  EXPECT_TRUE(contains(r.err, "rank 0 exited with status 4; stopping the other ranks")) << r.err;
  static const std::regex pid_line(R"(\[rank \d+\] PID (\d+))");
  for (std::sregex_iterator it(r.out.begin(), r.out.end(), pid_line), end; it != end; ++it)
    EXPECT_TRUE(process_gone(std::stoi((*it)[1]))) << "rank process " << (*it)[1] << " survived";
}

// --- config files -----------------------------------------------------------------------

TEST_F(LaunchTest, ConfigFileValuesAreUsedAndFlagsOverrideThem) {
  LaunchConfig c;
  c.num_processes = 2;
  c.mixed_precision = "bf16";
  c.gradient_accumulation_steps = 4;
  c.num_cpu_threads_per_process = 3;
  c.main_process_port = free_port();
  c.use_cpu = true;
  const std::string path = dir_.file("launch.yaml");
  c.save_yaml(path);

  Result r = launch({"--config_file", path}, {"--print-env"});
  ASSERT_EQ(r.status, 0) << describe(r);
  auto envs = rank_envs(r.out);
  ASSERT_EQ(envs.size(), 2u) << r.out;
  for (auto& [rank, e] : envs) {
    EXPECT_EQ(e["WORLD_SIZE"], "2");
    EXPECT_EQ(e["EMBER_MIXED_PRECISION"], "bf16");
    EXPECT_EQ(e["EMBER_GRADIENT_ACCUMULATION_STEPS"], "4");
    EXPECT_EQ(e["EMBER_NUM_THREADS"], "3");
    EXPECT_EQ(e["EMBER_USE_CPU"], "1");
    EXPECT_EQ(e["MASTER_PORT"], std::to_string(c.main_process_port));
  }

  r = launch({"--config_file", path, "--num_processes", "1", "--mixed_precision=fp16",
              "--gradient-accumulation-steps", "2"},
             {"--print-env"});
  ASSERT_EQ(r.status, 0) << describe(r);
  envs = rank_envs(r.out);
  ASSERT_EQ(envs.size(), 1u) << r.out;
  EXPECT_EQ(envs[0]["WORLD_SIZE"], "1");
  EXPECT_EQ(envs[0]["EMBER_MIXED_PRECISION"], "fp16");
  EXPECT_EQ(envs[0]["EMBER_GRADIENT_ACCUMULATION_STEPS"], "2");
  EXPECT_EQ(envs[0]["EMBER_NUM_THREADS"], "3");  // from the file still

  // The default config file is read without --config_file.
  r = launch({}, {"--print-env"}, {{"EMBER_CONFIG_FILE", path}});
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(rank_envs(r.out).size(), 2u) << r.out;
}

TEST_F(LaunchTest, BadConfigFilesAreReported) {
  const std::string path = dir_.file("bad.yaml");
  std::ofstream(path) << "num_processes: -3\n";
  Result r = launch({"--config_file", path}, {});
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.err, path)) << r.err;
  EXPECT_TRUE(contains(r.err, "num_processes")) << r.err;
  EXPECT_TRUE(contains(r.err, "-3")) << r.err;

  r = launch({"--config_file", dir_.file("absent.yaml")}, {});
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.err, "absent.yaml")) << r.err;

  // A key written twice would otherwise launch with whichever value came last.
  std::ofstream(path) << "num_processes: 4\nuse_cpu: true\nnum_processes: 2\n";
  r = launch({"--config_file", path}, {"--echo", "started"});
  EXPECT_EQ(r.status, 1) << describe(r);
  EXPECT_FALSE(contains(r.out, "[rank")) << describe(r);
  EXPECT_TRUE(contains(r.err, path)) << r.err;
  EXPECT_TRUE(contains(r.err, "key 'num_processes' appears twice, on line 1 and on line 3")) << r.err;
}

TEST_F(LaunchTest, ConfigCommandWritesFromFlags) {
  const std::string path = dir_.file("sub/config.yaml");
  const Result r = ember({"config", "--config_file", path, "--num_processes", "2", "--mixed_precision", "bf16",
                          "--gradient_accumulation_steps", "8", "--cpu", "--yes"});
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_TRUE(contains(r.out, path)) << r.out;
  const LaunchConfig c = LaunchConfig::load_yaml(path);
  EXPECT_EQ(c.num_processes, 2);
  EXPECT_EQ(c.mixed_precision, "bf16");
  EXPECT_EQ(c.gradient_accumulation_steps, 8);
  EXPECT_TRUE(c.use_cpu);
  EXPECT_EQ(c.num_machines, 1);

  // Without --config_file it writes the default path.
  const Result d = ember({"config", "--num_processes", "3", "--yes"});
  ASSERT_EQ(d.status, 0) << describe(d);
  EXPECT_EQ(LaunchConfig::load_yaml(dir_.file("no_such_config.yaml")).num_processes, 3);

  const Result bad = ember({"config", "--config_file", path, "--num_machines", "2", "--num_processes", "3", "--yes"});
  EXPECT_NE(bad.status, 0);
  EXPECT_TRUE(contains(bad.err, "split evenly")) << bad.err;
  EXPECT_EQ(LaunchConfig::load_yaml(path).num_processes, 2) << "a rejected config replaced the file";
}

TEST_F(LaunchTest, ConfigCommandAsksAndValidatesAnswers) {
  const std::string path = dir_.file("asked.yaml");
  // machines, machine rank, ip, port (default), processes (3 is rejected, then 4), cpu,
  // precision (fp8 rejected), accumulation (0 rejected), threads (default), restarts, the
  // machines' rendezvous timeout (0 rejected, then 45; asked on two machines only), monitor
  // interval (0 rejected, then 2.5). Then FSDP (the default, no).
  const std::string answers = "2\n1\n10.0.0.5\n\n3\n4\nyes\nfp8\nbf16\n0\n16\n\n2\n0\n45\n0\n2.5\n\n";
  const Result r = ember({"config", "--config_file", path}, {}, answers);
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_TRUE(contains(r.out, "[29500]")) << r.out;
  EXPECT_TRUE(contains(r.out, "split evenly")) << r.out;
  EXPECT_TRUE(contains(r.out, "'fp8'")) << r.out;
  const LaunchConfig c = LaunchConfig::load_yaml(path);
  EXPECT_EQ(c.num_machines, 2);
  EXPECT_EQ(c.machine_rank, 1);
  EXPECT_EQ(c.main_process_ip, "10.0.0.5");
  EXPECT_EQ(c.main_process_port, 29500);
  EXPECT_EQ(c.num_processes, 4);
  EXPECT_TRUE(c.use_cpu);
  EXPECT_EQ(c.mixed_precision, "bf16");
  EXPECT_EQ(c.gradient_accumulation_steps, 16);
  EXPECT_EQ(c.num_cpu_threads_per_process, 0);
  EXPECT_EQ(c.monitor_interval, 2.5);
  EXPECT_EQ(c.max_restarts, 2);
  EXPECT_EQ(c.rdzv_timeout, 45);
  EXPECT_TRUE(contains(r.out, "rdzv_timeout")) << r.out;  // the rejected 0, named
  EXPECT_FALSE(c.fsdp.has_value());

  // The existing file supplies the defaults; flags skip their questions.
  const Result again = ember({"config", "--config_file", path, "--mixed_precision", "fp16"}, {},
                             "\n\n\n\n\n\n\n\n\n\n\n\n\n");
  ASSERT_EQ(again.status, 0) << describe(again);
  EXPECT_FALSE(contains(again.out, "Mixed precision")) << again.out;
  const LaunchConfig kept = LaunchConfig::load_yaml(path);
  EXPECT_EQ(kept.num_processes, 4);
  EXPECT_EQ(kept.main_process_ip, "10.0.0.5");
  EXPECT_EQ(kept.mixed_precision, "fp16");

  // Input that ends early is an error, not a half-written file.
  const Result cut = ember({"config", "--config_file", dir_.file("cut.yaml")}, {}, "1\n");
  EXPECT_NE(cut.status, 0);
  EXPECT_TRUE(contains(cut.err, "input ended")) << cut.err;
  EXPECT_FALSE(std::filesystem::exists(dir_.file("cut.yaml")));
}

TEST_F(LaunchTest, ConfigCommandAsksAboutFsdp) {
  const std::string path = dir_.file("fsdp.yaml");
  // machines, processes, cpu, precision, accumulation, threads, restarts (3), monitor interval
  // (default); then FSDP: yes, the strategy (Accelerate's number 2 rejected), the wrap policy
  // (default), the classes (none rejected).
  const std::string answers = "1\n2\nyes\n\n\n\n3\n\nyes\n2\nSHARD_GRAD_OP\n\n\nBertLayer, BertPooler\n";
  const Result r = ember({"config", "--config_file", path}, {}, answers);
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_TRUE(contains(r.out, "FullyShardedDataParallel")) << r.out;
  EXPECT_TRUE(contains(r.out, "give the name, not a number")) << r.out;
  EXPECT_TRUE(contains(r.out, "name at least one module type")) << r.out;
  const LaunchConfig c = LaunchConfig::load_yaml(path);
  ASSERT_TRUE(c.fsdp.has_value());
  EXPECT_EQ(c.fsdp->sharding_strategy, ShardingStrategy::SHARD_GRAD_OP);
  EXPECT_EQ(c.fsdp->auto_wrap_policy, AutoWrapPolicy::TRANSFORMER_BASED_WRAP);
  EXPECT_EQ(c.fsdp->transformer_layer_cls_to_wrap, (std::vector<std::string>{"BertLayer", "BertPooler"}));
  EXPECT_EQ(c.distributed_type(), DistributedType::FSDP);
  EXPECT_EQ(c.max_restarts, 3);
  EXPECT_EQ(c.monitor_interval, 5.0);

  // One process: the question is not asked. Flags answer it (and imply --use_fsdp).
  const Result one = ember({"config", "--config_file", dir_.file("one.yaml")}, {}, "1\n1\nyes\n\n\n\n\n\n");
  ASSERT_EQ(one.status, 0) << describe(one);
  EXPECT_FALSE(contains(one.out, "FullyShardedDataParallel")) << one.out;
  const Result flags = ember({"config", "--config_file", dir_.file("flags.yaml"), "--num_processes", "2",
                              "--fsdp_sharding_strategy", "FULL_SHARD", "--fsdp_auto_wrap_policy", "NO_WRAP", "--yes"});
  ASSERT_EQ(flags.status, 0) << describe(flags);
  const LaunchConfig f = LaunchConfig::load_yaml(dir_.file("flags.yaml"));
  ASSERT_TRUE(f.fsdp.has_value());
  EXPECT_EQ(f.fsdp->auto_wrap_policy, AutoWrapPolicy::NO_WRAP);

  // Answering no turns off the sharding an existing file had.
  const Result off = ember({"config", "--config_file", path}, {}, "\n\n\n\n\n\n\n\nno\n");
  ASSERT_EQ(off.status, 0) << describe(off);
  EXPECT_FALSE(LaunchConfig::load_yaml(path).fsdp.has_value());
}

TEST_F(LaunchTest, EnvCommandDescribesTheMachine) {
  Result r = ember({"env"});
  ASSERT_EQ(r.status, 0) << describe(r);
  for (const char* fragment : {"Ember version:", "Compiler:", "CPU:", "CPU features:", "avx2=", "avx512f=",
                               "avx512_bf16=", "amx_bf16=", "CPU kernels:", "CPU cores", "threads", "CUDA build:", "CUDA devices:",
                               "NCCL:", "Gloo:", "no config file"})
    EXPECT_TRUE(contains(r.out, fragment)) << fragment << " missing in\n" << r.out;

  LaunchConfig c;
  c.num_processes = 6;
  c.save_yaml(dir_.file("env.yaml"));
  r = ember({"env"}, {{"EMBER_CONFIG_FILE", dir_.file("env.yaml")}});
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_TRUE(contains(r.out, "num_processes: 6")) << r.out;
  EXPECT_FALSE(contains(r.out, "no config file")) << r.out;

  // the pool's polling time, as EMBER_SPIN_US sets it; a bad value is an error naming it
  r = ember({"env"}, {{"EMBER_SPIN_US", "250"}});
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_TRUE(contains(r.out, "polling before sleeping: 250 us (EMBER_SPIN_US=250)")) << r.out;
  r = ember({"env"}, {{"EMBER_SPIN_US", "1ms"}});
  EXPECT_NE(r.status, 0) << describe(r);
  EXPECT_TRUE(contains(r.err, "EMBER_SPIN_US") && contains(r.err, "'1ms'")) << r.err;
}

}  // namespace
}  // namespace ember::distributed
