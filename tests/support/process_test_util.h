// What the multi-process tests share: a free loopback port, child processes started with their
// output in a log file, and reaping them by a deadline (a child still running then is killed).
#pragma once
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace ember::testing {

// A loopback port that was free a moment ago (bound to port 0, then released).
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(std::string("free_port: socket failed: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) throw std::runtime_error(std::string("free_port: cannot bind a port: ") + std::strerror(err));
  return ntohs(addr.sin_port);
}

// The variable's value when set and not empty, else `fallback`.
inline std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

// This process's environment with `changes` applied: a value adds or replaces the variable,
// nullopt removes it. As "NAME=value" strings.
inline std::vector<std::string> environment_with(const std::map<std::string, std::optional<std::string>>& changes) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string entry = *e;
    if (!changes.count(entry.substr(0, entry.find('=')))) env.push_back(entry);
  }
  for (const auto& [name, value] : changes)
    if (value) env.push_back(name + "=" + *value);
  return env;
}

inline std::vector<char*> c_strings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (const auto& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

// Starts args[0] with `args` and the environment `env`, its stdout and stderr written to `log`.
inline pid_t spawn_logged(const std::vector<std::string>& args, const std::string& log,
                          const std::vector<std::string>& env = environment_with({})) {
  std::vector<char*> argv = c_strings(args), envp = c_strings(env);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw std::runtime_error("posix_spawn " + args[0] + " failed: " + std::strerror(rc));
  return pid;
}

struct Reaped {
  int status = 0;       // as waitpid reports it
  bool killed = false;  // still running at the deadline, so killed
};

// Waits for every child until `deadline` passes, then kills and reaps the ones left.
inline std::vector<Reaped> reap_all(const std::vector<pid_t>& pids, std::chrono::steady_clock::duration deadline) {
  std::vector<Reaped> out(pids.size());
  std::vector<bool> done(pids.size(), false);
  const auto until = std::chrono::steady_clock::now() + deadline;
  size_t finished = 0;
  while (finished < pids.size() && std::chrono::steady_clock::now() < until) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (done[i]) continue;
      if (::waitpid(pids[i], &out[i].status, WNOHANG) == pids[i]) {
        done[i] = true;
        ++finished;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    if (done[i]) continue;
    ::kill(pids[i], SIGKILL);
    ::waitpid(pids[i], &out[i].status, 0);
    out[i].killed = true;
  }
  return out;
}

inline std::string read_text_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// How a child ended and what it printed; exit_code is -1 when it was killed (at the deadline
// or by a signal).
struct ChildOutcome {
  int exit_code = -1;
  std::string output;
};

// Waits for the children until `deadline` (reap_all) and reads each one's log.
inline std::vector<ChildOutcome> collect_outcomes(const std::vector<pid_t>& pids, const std::vector<std::string>& logs,
                                                  std::chrono::steady_clock::duration deadline) {
  const auto reaped = reap_all(pids, deadline);
  std::vector<ChildOutcome> out(pids.size());
  for (size_t i = 0; i < pids.size(); ++i) {
    if (reaped[i].killed) out[i].output = "(killed at the deadline)\n";
    else if (WIFEXITED(reaped[i].status)) out[i].exit_code = WEXITSTATUS(reaped[i].status);
    out[i].output += read_text_file(logs[i]);
  }
  return out;
}

// The variables that make a process rank `rank` of a `world`-process job meeting on loopback.
inline std::map<std::string, std::string> rank_environment(int rank, int world, const std::string& port) {
  return {{"RANK", std::to_string(rank)},       {"WORLD_SIZE", std::to_string(world)},
          {"LOCAL_RANK", std::to_string(rank)}, {"LOCAL_WORLD_SIZE", std::to_string(world)},
          {"MASTER_ADDR", "127.0.0.1"},         {"MASTER_PORT", port}};
}

// Starts `argv` as the ranks of a `world`-process job on loopback (a free port; world 0: one
// process without rank variables), each with the environment changed by `env` plus its rank
// variables, its output in log_prefix + "<rank>.log"; waits until `deadline`.
inline std::vector<ChildOutcome> run_loopback_job(const std::vector<std::string>& argv, int world,
                                                  const std::string& log_prefix,
                                                  const std::map<std::string, std::optional<std::string>>& env,
                                                  std::chrono::steady_clock::duration deadline) {
  const std::string port = std::to_string(free_port());
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  for (int r = 0; r < std::max(world, 1); ++r) {
    logs.push_back(log_prefix + std::to_string(r) + ".log");
    auto changes = env;
    if (world > 0)
      for (const auto& [k, v] : rank_environment(r, world, port)) changes[k] = v;
    pids.push_back(spawn_logged(argv, logs.back(), environment_with(changes)));
  }
  return collect_outcomes(pids, logs, deadline);
}

// One rank of a job run by run_rank_processes: its log file and how it ended.
struct RankProcess {
  std::string log;
  int status = -1;
  bool killed = false;
  bool exited_ok() const { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }
  // The log's text (deleted afterwards), prefixed with a line when the deadline killed it.
  std::string take_log() const {
    std::string text = read_text_file(log);
    std::remove(log.c_str());
    return killed ? "(killed at the deadline)\n" + text : text;
  }
};

// Starts `world` ranks of the test program `program` as `program mode rank world port` (rank 0
// serves the store on the port), waits at most `deadline` and kills what is left.
inline std::vector<RankProcess> run_rank_processes(const std::string& program, const std::string& mode, int world,
                                                   std::chrono::seconds deadline) {
#ifdef EMBER_TEST_PROGRAMS  // test binaries: the build's programs folder (support/test_paths.h)
  const std::string exe = std::string(EMBER_TEST_PROGRAMS) + "/" + program;
#else
  const char* dir = std::getenv("EMBER_TEST_PROGRAMS");
  const std::string exe = std::string(dir ? dir : ".") + "/" + program;
#endif
  const std::string port = std::to_string(free_port());
  std::vector<RankProcess> ranks(static_cast<size_t>(world));
  std::vector<pid_t> pids;
  const char* tmp = std::getenv("TMPDIR");
  for (int r = 0; r < world; ++r) {
    RankProcess& c = ranks[size_t(r)];
    c.log = std::string(tmp ? tmp : "/tmp") + "/" + program + "_" + mode + "_" + port + "_" + std::to_string(r) + ".log";
    pids.push_back(spawn_logged({exe, mode, std::to_string(r), std::to_string(world), port}, c.log));
  }
  const auto reaped = reap_all(pids, deadline);
  for (size_t i = 0; i < ranks.size(); ++i) {
    ranks[i].status = reaped[i].status;
    ranks[i].killed = reaped[i].killed;
  }
  return ranks;
}

}  // namespace ember::testing
