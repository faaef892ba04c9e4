#include "launch_limits.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "rank_supervisor.h"

namespace ember::cli {

namespace {

using distributed::LaunchConfig;

// Capability numbers from <linux/capability.h>.
constexpr int kCapSysAdmin = 21;
constexpr int kCapSysResource = 24;

std::string plural(long long n, const std::string& word) {
  return std::to_string(n) + " " + word + (n == 1 ? "" : "s");
}

// "num_processes 8 (8 ranks on this machine)", with the machines when there are several.
std::string describe_request(const LaunchConfig& config) {
  std::string s = "num_processes " + std::to_string(config.num_processes);
  if (config.num_machines > 1) s += " over " + std::to_string(config.num_machines) + " machines";
  return s + " (" + plural(config.local_processes(), "rank") + " on this machine)";
}

const char* kLowerRequest = "lower num_processes, or spread the ranks over more machines with --num_machines";

std::optional<std::string> read_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  return line;
}

std::optional<long long> parse_count(const std::string& text) {
  if (text.empty() || !std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isdigit(c); }))
    return std::nullopt;
  return std::strtoll(text.c_str(), nullptr, 10);
}

std::optional<long long> read_count(const std::string& path) {
  const auto line = read_first_line(path);
  return line ? parse_count(*line) : std::nullopt;
}

// The value of a "Name:\tvalue ..." line of a /proc/<pid>/status file.
std::optional<std::string> status_field(const std::string& status_path, const std::string& name) {
  std::ifstream in(status_path);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(name + ":", 0) == 0) return line.substr(name.size() + 1);
  return std::nullopt;
}

bool has_capability(int cap) {
  const auto caps = status_field("/proc/self/status", "CapEff");
  if (!caps) return false;
  const unsigned long long bits = std::strtoull(caps->c_str(), nullptr, 16);
  return (bits >> cap) & 1;
}

// The kernel counts RLIMIT_NPROC per real user, in tasks (every thread is one), and does not
// apply it to root or to a process holding CAP_SYS_RESOURCE or CAP_SYS_ADMIN.
bool nproc_applies() { return ::getuid() != 0 && !has_capability(kCapSysResource) && !has_capability(kCapSysAdmin); }

long long tasks_of_user(uid_t uid) {
  long long tasks = 0;
  DIR* proc = ::opendir("/proc");
  if (!proc) return 0;
  while (const dirent* entry = ::readdir(proc)) {
    if (!parse_count(entry->d_name)) continue;
    const std::string status = std::string("/proc/") + entry->d_name + "/status";
    const auto uids = status_field(status, "Uid");
    const auto threads = status_field(status, "Threads");
    if (!uids || !threads) continue;  // gone meanwhile
    std::istringstream fields(*uids);
    long long real = -1;
    fields >> real;
    if (real == static_cast<long long>(uid)) tasks += std::max(1LL, std::atoll(threads->c_str()));
  }
  ::closedir(proc);
  return tasks;
}

// Tasks (processes and threads) on the whole machine: the denominator of /proc/loadavg's
// "running/total" field.
std::optional<long long> tasks_on_machine() {
  const auto line = read_first_line("/proc/loadavg");
  if (!line) return std::nullopt;
  const size_t slash = line->find('/');
  if (slash == std::string::npos) return std::nullopt;
  return parse_count(line->substr(slash + 1, line->find(' ', slash) - slash - 1));
}

// How many more tasks one limit lets this launcher create, and what the limit is.
struct Room {
  long long free = 0;
  std::string limit;   // what it is and how full
  std::string change;  // how to raise it
};

// The pids controller of this process's control group and of every group above it
// (cgroup v2, or v1 mounted at /sys/fs/cgroup/pids).
void add_cgroup_rooms(std::vector<Room>& rooms) {
  std::ifstream in("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);) {
    // "0::/path" (v2) or "N:controller,...:/path" (v1)
    const size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    std::string base;
    if (controllers.empty() && line.compare(0, first, "0") == 0) {
      base = "/sys/fs/cgroup";
    } else {
      std::istringstream names(controllers);
      for (std::string name; std::getline(names, name, ',');)
        if (name == "pids") base = "/sys/fs/cgroup/pids";
    }
    if (base.empty()) continue;
    std::string group = line.substr(second + 1);
    for (;;) {
      const std::string dir = base + (group == "/" ? "" : group);
      const auto max = read_count(dir + "/pids.max");  // "max" (no limit) reads as none
      const auto current = read_count(dir + "/pids.current");
      if (max && current)
        rooms.push_back({*max - *current,
                         "the control group " + dir + " allows " + std::to_string(*max) +
                             " processes and threads (pids.max) and holds " + std::to_string(*current),
                         "Raise its pids.max (a container's --pids-limit)"});
      if (group.empty() || group == "/") break;
      const size_t up = group.rfind('/');
      group = up == 0 || up == std::string::npos ? "/" : group.substr(0, up);
    }
  }
}

// What limits the processes `ranks` more would need.
std::vector<Room> process_rooms(long long ranks) {
  std::vector<Room> rooms;
  rlimit nproc{};
  if (::getrlimit(RLIMIT_NPROC, &nproc) == 0 && nproc.rlim_cur != RLIM_INFINITY && nproc_applies()) {
    const long long limit = static_cast<long long>(nproc.rlim_cur);
    const long long used = tasks_of_user(::getuid());
    const bool hard_too = nproc.rlim_max != RLIM_INFINITY && static_cast<long long>(nproc.rlim_max) < used + ranks;
    const std::string hard =
        nproc.rlim_max == RLIM_INFINITY ? "unlimited" : std::to_string(static_cast<long long>(nproc.rlim_max));
    rooms.push_back({limit - used,
                     "this user's process limit (ulimit -u, RLIMIT_NPROC) is " + std::to_string(limit) + " and " +
                         std::to_string(used) + " of its processes and threads are running",
                     "Raise it with `ulimit -u N` (the hard limit is " + hard +
                         (hard_too ? ", so raise that first)" : ")")});
  }
  add_cgroup_rooms(rooms);
  if (const auto total = tasks_on_machine()) {
    if (const auto threads_max = read_count("/proc/sys/kernel/threads-max"))
      rooms.push_back({*threads_max - *total,
                       "kernel.threads-max is " + std::to_string(*threads_max) + " and " + std::to_string(*total) +
                           " processes and threads exist",
                       "Raise it with `sysctl kernel.threads-max=N`"});
    if (const auto pid_max = read_count("/proc/sys/kernel/pid_max"))
      rooms.push_back({*pid_max - *total,
                       "kernel.pid_max is " + std::to_string(*pid_max) + " and " + std::to_string(*total) +
                           " processes and threads exist",
                       "Raise it with `sysctl kernel.pid_max=N`"});
  }
  return rooms;
}

long long open_descriptors() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (!dir) return 3;
  long long n = 0;
  while (const dirent* entry = ::readdir(dir))
    if (entry->d_name[0] != '.') ++n;
  ::closedir(dir);
  return n - 1;  // the directory's own
}

void check_ranks_per_cpu(const LaunchConfig& config) {
  const long long cpus = distributed::available_cpus();
  const long long most = cpus * kMaxRanksPerCpu;
  EMBER_CHECK(config.local_processes() <= most, "ember launch: ", describe_request(config), " is more than ",
              kMaxRanksPerCpu, " ranks for each of the ", plural(cpus, "CPU"),
              " this launcher may use (at most ", most, " here; a rank per CPU or per GPU is the usual): ",
              kLowerRequest);
}

void check_processes(const LaunchConfig& config) {
  const std::vector<Room> rooms = process_rooms(config.local_processes());
  if (rooms.empty()) return;
  const Room& tightest = *std::min_element(rooms.begin(), rooms.end(),
                                           [](const Room& a, const Room& b) { return a.free < b.free; });
  const long long free = std::max(0LL, tightest.free);
  EMBER_CHECK(config.local_processes() <= free, "ember launch: ", describe_request(config),
              " cannot start: every rank is a process, and only ", free,
              " more can be created here: ", tightest.limit, ", and each rank's threads count too. ", tightest.change,
              ", or ", kLowerRequest);
}

void check_descriptors(const LaunchConfig& config) {
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) != 0 || nofile.rlim_cur == RLIM_INFINITY) return;
  const long long limit = static_cast<long long>(nofile.rlim_cur);
  const long long open = open_descriptors();
  const long long needed = open + supervisor_descriptors(config.local_processes());
  if (needed <= limit) return;
  const long long fitting = std::max(0LL, (limit - open - supervisor_descriptors(0)) / kDescriptorsPerRank);
  const bool hard_too = nofile.rlim_max != RLIM_INFINITY && static_cast<long long>(nofile.rlim_max) < needed;
  const std::string hard =
      nofile.rlim_max == RLIM_INFINITY ? "unlimited" : std::to_string(static_cast<long long>(nofile.rlim_max));
  EMBER_FAIL("ember launch: ", describe_request(config),
             " cannot start: the launcher reads each rank's output through ", kDescriptorsPerRank,
             " pipes, which takes ", needed, " file descriptors with the ", open,
             " already open, but the open-file limit (ulimit -n, RLIMIT_NOFILE) is ", limit,
             ". Raise it with `ulimit -n ", needed, "` or more (the hard limit is ", hard,
             hard_too ? ", so raise that first" : "", "), or lower num_processes so that at most ",
             plural(fitting, "rank"), " run on this machine");
}

}  // namespace

void check_launch_limits(const LaunchConfig& config) {
  check_ranks_per_cpu(config);
  check_processes(config);
  check_descriptors(config);
}

}  // namespace ember::cli
