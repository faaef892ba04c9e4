// A child process for the store tests: started with posix_spawn, its stdout and stderr captured
// through one pipe, every wait bounded, and killed on destruction if still running.
#pragma once
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "process_test_util.h"

namespace ember::testing {

class ChildProcess {
 public:
  // Runs args[0] with `args`; `env` adds or replaces variables (nullopt removes one).
  explicit ChildProcess(const std::vector<std::string>& args,
                        const std::map<std::string, std::optional<std::string>>& env = {}) {
    const std::vector<std::string> env_strings = environment_with(env);

    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    read_fd_ = fds[0];
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
    std::vector<char*> argv = c_strings(args), envp = c_strings(env_strings);
    int rc = posix_spawn(&pid_, args[0].c_str(), &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    ::close(fds[1]);
    if (rc != 0) throw std::runtime_error("posix_spawn " + args[0] + ": " + std::strerror(rc));
  }

  ~ChildProcess() {
    kill();
    if (read_fd_ >= 0) ::close(read_fd_);
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // The next line of output, or nullopt if none arrives within `within`.
  std::optional<std::string> read_line(std::chrono::milliseconds within) {
    auto deadline = std::chrono::steady_clock::now() + within;
    while (true) {
      size_t nl = output_.find('\n', line_start_);
      if (nl != std::string::npos) {
        std::string line = output_.substr(line_start_, nl - line_start_);
        line_start_ = nl + 1;
        return line;
      }
      if (std::chrono::steady_clock::now() >= deadline || !drain(20)) return std::nullopt;
    }
  }

  // The exit code, or -1 when the child had to be killed at the deadline (or died by a signal).
  int wait(std::chrono::milliseconds within) {
    auto deadline = std::chrono::steady_clock::now() + within;
    while (!exited_) {
      reap(WNOHANG);
      if (exited_) break;
      if (std::chrono::steady_clock::now() >= deadline) {
        kill();
        break;
      }
      drain(20);
    }
    while (drain(0)) {
    }
    return exit_code_;
  }

  void kill() {
    if (!exited_ && pid_ > 0) {
      ::kill(pid_, SIGKILL);
      reap(0);
    }
  }

  // Everything the child printed so far.
  const std::string& output() const { return output_; }

 private:
  // Reads what is available within timeout_ms; false at end of output.
  bool drain(int timeout_ms) {
    if (read_fd_ < 0) return false;
    pollfd p{read_fd_, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return !exited_;
    char buf[4096];
    ssize_t n = ::read(read_fd_, buf, sizeof(buf));
    if (n <= 0) return false;
    output_.append(buf, static_cast<size_t>(n));
    return true;
  }

  void reap(int flags) {
    int status = 0;
    pid_t r = waitpid(pid_, &status, flags);
    if (r == pid_) {
      exited_ = true;
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
  }

  pid_t pid_ = -1;
  int read_fd_ = -1;
  bool exited_ = false;
  int exit_code_ = -1;
  std::string output_;
  size_t line_start_ = 0;
};

}  // namespace ember::testing
