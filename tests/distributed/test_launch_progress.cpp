// Progress bars under `ember launch`: tests/programs/progress_target runs a ProgressBar on two
// ranks; only local rank 0 draws, a log gets complete lines (a forced bar's redraws collapsed
// to its final state), and a terminal on the launcher's stderr gets the bar redrawn in place.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "process_test_util.h"
#include "test_util.h"

namespace ember::distributed {
namespace {

using ember::testing::env_or;
using ember::testing::TempDir;

std::string ember_cli() { return env_or("EMBER_CLI", EMBER_CLI); }
std::string target_program() { return env_or("EMBER_TEST_PROGRAMS", EMBER_TEST_PROGRAMS) + "/progress_target"; }

std::vector<std::string> launch_args() {
  return {ember_cli(), "launch", "--num_processes", "2", "--cpu", "--main_process_port",
          std::to_string(ember::testing::free_port()), target_program()};
}

// The test's environment without a user's progress choice or config, plus `progress`.
std::vector<std::string> launch_env(const TempDir& dir, std::optional<std::string> progress) {
  return ember::testing::environment_with(
      {{"EMBER_CONFIG_FILE", dir.file("no_such_config.yaml")}, {"EMBER_PROGRESS", std::move(progress)}});
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

int count_matching(const std::string& text, const std::regex& pattern) {
  int n = 0;
  for (const std::string& line : lines_of(text)) n += std::regex_match(line, pattern) ? 1 : 0;
  return n;
}

bool contains(const std::string& text, const std::string& fragment) { return text.find(fragment) != std::string::npos; }

// Runs the launch with stdout and stderr in one log file; returns the log.
std::string run_logged(const TempDir& dir, std::optional<std::string> progress) {
  const std::string log = dir.file("launch.log");
  const pid_t pid = ember::testing::spawn_logged(launch_args(), log, launch_env(dir, std::move(progress)));
  const auto reaped = ember::testing::reap_all({pid}, std::chrono::seconds(60));
  const std::string text = ember::testing::read_text_file(log);
  EXPECT_FALSE(reaped[0].killed) << text;
  EXPECT_TRUE(WIFEXITED(reaped[0].status) && WEXITSTATUS(reaped[0].status) == 0) << text;
  return text;
}

void expect_both_ranks_ran(const std::string& log) {
  for (const char* rank : {"0", "1"}) {
    EXPECT_TRUE(contains(log, std::string("[rank ") + rank + "] half way on rank " + rank + "\n")) << log;
    EXPECT_TRUE(contains(log, std::string("[rank ") + rank + "] done rank " + rank + "\n")) << log;
  }
}

TEST(LaunchProgress, ALogGetsOneFinalLineFromRankZeroOnly) {
  TempDir dir("ember_launch_progress");
  const std::string log = run_logged(dir, std::nullopt);
  static const std::regex final_line(R"(^\[rank 0\] work 5/5 item 100% .+ elapsed \d\d:\d\d eta 00:00 \| rank 0$)");
  EXPECT_EQ(count_matching(log, final_line), 1) << log;
  EXPECT_FALSE(contains(log, "[rank 1] work")) << log;
  EXPECT_FALSE(contains(log, "\r")) << log;
  expect_both_ranks_ran(log);
}

TEST(LaunchProgress, AForcedBarIsCollapsedToItsFinalStateInALog) {
  TempDir dir("ember_launch_progress");
  const std::string log = run_logged(dir, "bar");
  static const std::regex final_line(
      R"(^\[rank 0\] work \[#{24}\] 5/5 item 100% .+ elapsed \d\d:\d\d eta 00:00 \| rank 0$)");
  EXPECT_EQ(count_matching(log, final_line), 1) << log;
  EXPECT_FALSE(contains(log, "\r")) << log;
  EXPECT_FALSE(contains(log, "\033")) << log;
  EXPECT_FALSE(contains(log, "[rank 1] work")) << log;
  expect_both_ranks_ran(log);
}

// The launcher's stderr on a pseudo-terminal, its stdout in a file.
TEST(LaunchProgress, ATerminalGetsTheBarRedrawnInPlace) {
  TempDir dir("ember_launch_progress");
  const int master = ::posix_openpt(O_RDWR | O_NOCTTY);
  ASSERT_GE(master, 0) << "posix_openpt";
  ASSERT_EQ(::grantpt(master), 0);
  ASSERT_EQ(::unlockpt(master), 0);
  const std::string terminal = ::ptsname(master);
  const std::string out_log = dir.file("stdout.log");

  const std::vector<std::string> args = launch_args();
  const std::vector<std::string> env = launch_env(dir, std::nullopt);
  std::vector<char*> argv = ember::testing::c_strings(args), envp = ember::testing::c_strings(env);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int err = ::open(terminal.c_str(), O_RDWR | O_NOCTTY);
    const int out = ::open(out_log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (err < 0 || out < 0) ::_exit(125);
    ::dup2(out, STDOUT_FILENO);
    ::dup2(err, STDERR_FILENO);
    ::close(master);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(126);
  }

  // Everything the terminal receives, until the launcher (its only writer) has gone.
  std::string screen;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{master, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    char buffer[4096];
    const ssize_t n = ::read(master, buffer, sizeof buffer);
    if (n <= 0) break;  // EIO once the last writer has closed it
    screen.append(buffer, size_t(n));
  }
  const auto reaped = ember::testing::reap_all({pid}, std::chrono::seconds(10));
  ::close(master);
  const std::string log = ember::testing::read_text_file(out_log);
  EXPECT_FALSE(reaped[0].killed);
  EXPECT_TRUE(WIFEXITED(reaped[0].status) && WEXITSTATUS(reaped[0].status) == 0) << log << screen;

  // Bar mode (told by the launcher) and redrawn in place behind the prefix.
  EXPECT_TRUE(contains(screen, "\r\033[K[rank 0] work [########################] 5/5 item 100% ")) << screen;
  EXPECT_FALSE(contains(screen, "[rank 1] work")) << screen;
  EXPECT_FALSE(contains(screen, "\033[K\033[K")) << "the rank's own erase sequence is not passed on: " << screen;
  expect_both_ranks_ran(log);
}

}  // namespace
}  // namespace ember::distributed
