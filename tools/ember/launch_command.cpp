// `ember launch`: settings from defaults, then the config file, then flags; then the local
// ranks are started with the rendezvous environment and supervised.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <set>
#include <string>
#include <system_error>

#include "accelerate/launch_config.h"
#include "command_line.h"
#include "core/error.h"
#include "distributed/rendezvous.h"
#include "elastic_runs.h"
#include "launch_limits.h"
#include "machine_coordinator.h"
#include "rank_supervisor.h"
#include "slurm_launch.h"
#include "subcommands.h"

extern char** environ;

namespace ember::cli {

namespace {

using distributed::LaunchConfig;

struct LaunchRequest {
  std::optional<std::string> config_file;
  std::vector<std::pair<const ConfigFlag*, std::string>> overrides;  // in command-line order
  std::vector<std::string> program_and_args;
  bool help = false;
};

LaunchRequest parse(const std::vector<std::string>& args) {
  LaunchRequest request;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      request.help = true;
      return request;
    }
    if (arg == "--") {
      ++i;
      break;
    }
    std::string name, value;
    bool has_value = false;
    if (!split_flag(arg, name, value, has_value)) {
      if (!arg.empty() && arg[0] == '-') throw UsageError("unknown option '" + arg + "'");
      break;  // the program: it and everything after it belong to the ranks
    }
    const ConfigFlag* flag = find_config_flag(name);
    const bool takes_value = name == "config_file" || (flag && flag->value_name);
    if (!flag && name != "config_file") throw UsageError("unknown option '" + arg + "'");
    if (takes_value && !has_value) {
      if (i + 1 >= args.size()) throw UsageError("option '--" + name + "' needs a value");
      value = args[++i];
    } else if (!takes_value && has_value) {
      throw UsageError("option '--" + name + "' takes no value");
    }
    if (name == "config_file")
      request.config_file = value;
    else
      request.overrides.emplace_back(flag, value);
  }
  request.program_and_args.assign(args.begin() + std::ptrdiff_t(i), args.end());
  if (request.program_and_args.empty()) throw UsageError("no PROGRAM to launch");
  return request;
}

// Checked as exec will check it: with the effective user, which differs from the real one under
// a set-user-id wrapper or `setpriv --ruid`.
bool may_execute(const std::string& path) { return ::faccessat(AT_FDCWD, path.c_str(), X_OK, AT_EACCESS) == 0; }

bool is_executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && may_execute(path);
}

// A path is used as given; a bare name is looked up in PATH, then in the current directory.
std::string resolve_program(const std::string& program) {
  struct stat st {};
  if (program.find('/') != std::string::npos) {
    EMBER_CHECK(::stat(program.c_str(), &st) == 0, "ember launch: program '", program, "' does not exist");
    EMBER_CHECK(S_ISREG(st.st_mode) && may_execute(program), "ember launch: program '", program,
                "' is not an executable file");
    return program;
  }
  const char* path_env = std::getenv("PATH");
  std::string path = path_env ? path_env : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    const std::string dir = end > start ? path.substr(start, end - start) : ".";
    const std::string candidate = dir + "/" + program;
    if (is_executable_file(candidate)) return candidate;
    start = end + 1;
  }
  if (is_executable_file("./" + program)) return "./" + program;
  EMBER_FAIL("ember launch: cannot find program '", program, "' (not in PATH, not in the current directory)");
}

// The ranks write into pipes, so a progress bar cannot see the user's terminal by itself: the
// main rank is told (EMBER_PROGRESS=tty, see tracking/progress.h) when the launcher's stderr is one
// and the user has not chosen a progress mode.
bool main_rank_draws_on_terminal() {
  const char* chosen = std::getenv("EMBER_PROGRESS");
  return (!chosen || !*chosen) && ::isatty(STDERR_FILENO) != 0;
}

// The launcher's environment with the rank's variables put in place of any inherited ones. An
// inherited EMBER_FSDP_* is dropped too: the launcher states every field it does not leave to
// the default, and one it leaves must not come from the shell.
std::vector<std::string> environment_for(const LaunchConfig& config, int local_rank, int attempt,
                                         const std::string& heartbeat_dir) {
  auto variables = distributed::rank_environment(config, local_rank);
  variables.emplace_back("EMBER_RESTART_COUNT", std::to_string(attempt));
  variables.emplace_back("EMBER_MAX_RESTARTS", std::to_string(config.max_restarts));
  if (!heartbeat_dir.empty()) variables.emplace_back("EMBER_HEARTBEAT_DIR", heartbeat_dir);
  if (local_rank == 0 && main_rank_draws_on_terminal()) variables.emplace_back("EMBER_PROGRESS", "tty");
  std::set<std::string> replaced;
  for (const auto& [name, value] : variables) replaced.insert(name);
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    const std::string entry(*e);
    const std::string name = entry.substr(0, entry.find('='));
    if (!replaced.count(name) && name.rfind("EMBER_FSDP_", 0) != 0) env.push_back(entry);
  }
  for (const auto& [name, value] : variables) env.push_back(name + "=" + value);
  return env;
}

// A private directory for the ranks' heartbeats, removed when the launcher returns.
class HeartbeatDirectory {
 public:
  HeartbeatDirectory() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/ember-launch-XXXXXX";
    if (::mkdtemp(pattern.data())) path_ = pattern;
    // Without one the job still runs, unmonitored.
    else std::cerr << "ember launch: warning: cannot create " << pattern << " (" << std::strerror(errno)
                   << "); the ranks' progress is not monitored\n";
  }
  ~HeartbeatDirectory() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  HeartbeatDirectory(const HeartbeatDirectory&) = delete;
  HeartbeatDirectory& operator=(const HeartbeatDirectory&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace

std::string launch_usage() {
  return "usage: ember launch [options] PROGRAM [ARGS...]\n"
         "\n"
         "Starts the ranks of PROGRAM on this machine with MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE,\n"
         "LOCAL_RANK, LOCAL_WORLD_SIZE and the EMBER_* settings in their environment, prefixes every line\n"
         "they print with \"[rank R] \", and stops them all when one fails. Settings come from the flags,\n"
         "then the config file (see `ember config`), then the defaults.\n"
         "\n"
         "Progress bars are drawn by local rank 0 only. When this command's stderr is a terminal and\n"
         "EMBER_PROGRESS is unset, local rank 0 gets EMBER_PROGRESS=tty and its bar is redrawn in place\n"
         "behind its prefix; elsewhere only the final state of a redrawn line is written.\n"
         "A user's own EMBER_PROGRESS (off, lines, bar) is passed on unchanged.\n"
         "\n"
         "Before any rank starts, the request must fit this machine: at most " +
         std::to_string(kMaxRanksPerCpu) +
         " ranks per CPU it may use, no more\n"
         "ranks than processes can still be created (ulimit -u, the control group's pids.max,\n"
         "kernel.threads-max, kernel.pid_max), and " +
         std::to_string(kDescriptorsPerRank) +
         " file descriptors per rank within the open-file limit (ulimit -n).\n"
         "A rank that cannot be started stops the ones already running.\n"
         "\n"
         "With --max_restarts N, a failed rank (non-zero exit or a signal) stops the others and every\n"
         "rank is started again, up to N times, with EMBER_RESTART_COUNT set to the restart's number;\n"
         "the program resumes from its latest checkpoint (Accelerator::load_state() with no\n"
         "directory). After the last attempt a summary of every attempt is written to stderr.\n"
         "Every --monitor_interval seconds the ranks' progress (their Accelerator's backward passes)\n"
         "is checked, and a rank that made none for that long is named, stopped ones pointed out.\n"
         "With --heartbeat_timeout S, a rank that made no progress for S seconds after its first\n"
         "backward pass counts as failed (status 1): a hung or stopped rank ends the attempt too.\n"
         "On several machines (--num_machines) the launchers restart together: machine 0's launcher\n"
         "serves them a store at --main_process_port + 1, a failure on any machine stops the ranks\n"
         "on all of them, and a machine that does not come back within --rdzv_timeout seconds ends\n"
         "the job.\n"
         "\n"
         "options:\n" +
         describe_config_flags() +
         "  --config_file F                           config file (default: " +
         "$EMBER_CONFIG_FILE,\n"
         "                                            $XDG_CONFIG_HOME/ember/default_config.yaml or\n"
         "                                            ~/.config/ember/default_config.yaml)\n"
         "  -h, --help                                this text\n"
         "\n"
         "PROGRAM is a path, or a name looked up in PATH and then in the current directory.\n"
         "The exit status is 0 when every rank succeeds, else the status of the first rank that failed\n"
         "in the last attempt (128 + signal number for a rank killed by a signal).\n";
}

int launch_command(const std::vector<std::string>& args) {
  const LaunchRequest request = parse(args);
  if (request.help) {
    std::cout << launch_usage();
    return 0;
  }

  LaunchConfig config;
  if (request.config_file) {
    config = LaunchConfig::load_yaml(*request.config_file);
  } else if (auto found = distributed::load_default_config()) {
    config = *found;
  }
  std::set<std::string> flags_given;
  for (const auto& [flag, value] : request.overrides) {
    flag->apply(config, value);
    flags_given.insert(flag->name);
  }
  apply_slurm_machine_settings(config, flags_given, distributed::environment_variable);
  config.validate("ember launch settings (config file and flags)");

  SupervisorOptions options;
  options.program = resolve_program(request.program_and_args.front());
  options.argv = request.program_and_args;

  check_launch_limits(config);
  const HeartbeatDirectory heartbeats;
  options.heartbeat_dir = heartbeats.path();
  options.monitor_interval = std::chrono::milliseconds(std::max<long long>(1, std::llround(config.monitor_interval * 1000)));
  options.heartbeat_timeout = std::chrono::milliseconds(std::llround(config.heartbeat_timeout * 1000));
  const int local = config.local_processes();
  // Several machines that restart: their launchers agree on every attempt.
  std::optional<MachineCoordinator> machines;
  if (config.num_machines > 1 && config.max_restarts > 0) machines.emplace(config);
  return run_with_restarts(
      options, config.max_restarts,
      [&](int attempt) {
        std::vector<RankProcess> ranks;
        for (int local_rank = 0; local_rank < local; ++local_rank)
          ranks.push_back({config.machine_rank * local + local_rank,
                           environment_for(config, local_rank, attempt, heartbeats.path())});
        return ranks;
      },
      machines ? &*machines : nullptr);
}

}  // namespace ember::cli
