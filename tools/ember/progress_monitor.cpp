#include "progress_monitor.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "accelerate/heartbeat.h"

namespace ember::cli {

namespace {

// Until every rank trains, heartbeats are read this often, so the restart latency is measured
// to a tenth of a second; after that, once per monitor interval.
constexpr std::chrono::milliseconds kStartupPoll{100};

std::string list(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
  return out;
}

}  // namespace

bool process_is_stopped(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", int(pid));
  std::FILE* f = std::fopen(path, "r");
  if (!f) return false;
  char buffer[512];
  const size_t n = std::fread(buffer, 1, sizeof(buffer) - 1, f);
  std::fclose(f);
  buffer[n] = '\0';
  // "pid (comm) S ...": the command may hold spaces and parentheses, the state follows the last ')'.
  const std::string_view stat(buffer, n);
  const size_t close = stat.rfind(')');
  if (close == std::string_view::npos || close + 2 >= stat.size()) return false;
  const char state = stat[close + 2];
  return state == 'T' || state == 't';
}

ProgressMonitor::ProgressMonitor(std::string heartbeat_dir, std::chrono::milliseconds interval, std::vector<int> ranks,
                                 std::chrono::milliseconds heartbeat_timeout)
    : dir_(std::move(heartbeat_dir)),
      interval_(interval),
      ranks_(std::move(ranks)),
      heartbeat_timeout_(heartbeat_timeout),
      steps_(ranks_.size(), -1),
      resumed_from_(ranks_.size(), 0),
      changed_at_(ranks_.size(), Clock::now()),
      warned_(ranks_.size(), false),
      last_check_(Clock::now()) {}

ProgressMonitor::Clock::time_point ProgressMonitor::next_check() const {
  auto period = all_training_ ? std::min(interval_, std::chrono::milliseconds(1000)) : kStartupPoll;
  if (heartbeat_timeout_.count() > 0) period = std::min(period, std::max(heartbeat_timeout_ / 4, kStartupPoll));
  return last_check_ + period;
}

std::optional<size_t> ProgressMonitor::check(const std::vector<pid_t>& pids, Clock::time_point now) {
  last_check_ = now;
  bool all_training = true;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    if (const auto beat = distributed::read_heartbeat(distributed::heartbeat_path(dir_, ranks_[i]));
        beat && beat->step != steps_[i]) {
      steps_[i] = beat->step;
      resumed_from_[i] = beat->resumed_from;
      changed_at_[i] = now;
      warned_[i] = false;
    }
    all_training = all_training && steps_[i] >= 0 && steps_[i] > resumed_from_[i];
  }
  if (all_training && !all_training_) all_training_ = now;

  // Of the ranks silent past the timeout, the one to blame: a stopped one, else the one
  // furthest behind (the others usually wait for it in a collective).
  std::optional<size_t> lost;
  if (heartbeat_timeout_.count() > 0)
    for (size_t i = 0; i < ranks_.size(); ++i) {
      if (pids[i] < 0 || steps_[i] < 0 || now - changed_at_[i] < heartbeat_timeout_) continue;
      const auto rank_of = [&](size_t k) { return std::make_pair(!process_is_stopped(pids[k]), steps_[k]); };
      if (!lost || rank_of(i) < rank_of(*lost)) lost = i;
    }

  // Ranks silent for a whole interval, named once per stall; the stopped ones are pointed out,
  // since the others usually wait for them in a collective.
  std::vector<std::string> stalled, stopped;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    if (pids[i] < 0 || steps_[i] < 0 || warned_[i] || now - changed_at_[i] < interval_) continue;
    warned_[i] = true;
    stalled.push_back(std::to_string(ranks_[i]) + " (step " + std::to_string(steps_[i]) + ")");
    if (process_is_stopped(pids[i])) stopped.push_back(std::to_string(ranks_[i]));
  }
  if (stalled.empty()) return lost;
  const auto seconds = std::chrono::duration<double>(interval_).count();
  char interval_text[32];
  std::snprintf(interval_text, sizeof(interval_text), "%g", seconds);
  std::string message = "ember launch: warning: no progress for " + std::string(interval_text) + " s from " +
                        (stalled.size() == 1 ? "rank " : "ranks ") + list(stalled);
  if (!stopped.empty())
    message += "; " + std::string(stopped.size() == 1 ? "rank " : "ranks ") + list(stopped) +
               (stopped.size() == 1 ? " is" : " are") + " stopped (SIGSTOP or a debugger): the others wait for it";
  message += "\n";
  std::fputs(message.c_str(), stderr);
  std::fflush(stderr);
  return lost;
}

}  // namespace ember::cli
