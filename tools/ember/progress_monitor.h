// The launcher's view of its ranks' progress: each rank's Accelerator writes its backward-pass
// count to <heartbeat_dir>/rank_<R> (accelerate/heartbeat.h); the monitor reads those files,
// says on stderr which ranks have made no progress for a whole monitor interval (and which of
// them the kernel reports as stopped, as SIGSTOP or a debugger leave a process), and notes
// when every rank is training (the restart latency `ember launch` reports). With a heartbeat
// timeout, a rank silent for that long after its first heartbeat is reported lost, so the
// launcher can stop the job (and restart it). A rank that never writes a heartbeat (a program
// without an Accelerator) is never named.
#pragma once
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ember::cli {

class ProgressMonitor {
 public:
  using Clock = std::chrono::steady_clock;

  // `ranks`: the global rank of each supervised process, in start order.
  // `heartbeat_timeout` zero: no rank is ever reported lost.
  ProgressMonitor(std::string heartbeat_dir, std::chrono::milliseconds interval, std::vector<int> ranks,
                  std::chrono::milliseconds heartbeat_timeout = std::chrono::milliseconds(0));

  bool enabled() const { return !dir_.empty(); }
  // When the monitor wants to look next.
  Clock::time_point next_check() const;
  // Reads every heartbeat; `pids[i]` is process i's pid, or -1 once it has exited. Writes the
  // stall warnings. Call it at (or after) next_check(). Returns the index of a running process
  // whose heartbeat has been silent for the heartbeat timeout, if any.
  std::optional<size_t> check(const std::vector<pid_t>& pids, Clock::time_point now);

  // Each process's last reported step (-1: none yet).
  const std::vector<int64_t>& steps() const { return steps_; }
  // When every process had reported a step above the one it resumed from (a backward pass
  // after its resume), if that happened.
  std::optional<Clock::time_point> all_training_since() const { return all_training_; }

 private:
  std::string dir_;
  std::chrono::milliseconds interval_;
  std::vector<int> ranks_;
  std::chrono::milliseconds heartbeat_timeout_;
  std::vector<int64_t> steps_;
  std::vector<int64_t> resumed_from_;
  std::vector<Clock::time_point> changed_at_;  // when steps_[i] last changed
  std::vector<bool> warned_;                   // named during the current stall
  std::optional<Clock::time_point> all_training_;
  Clock::time_point last_check_;
};

// True when the kernel reports process `pid` stopped (state T or t in /proc/<pid>/stat).
bool process_is_stopped(pid_t pid);

}  // namespace ember::cli
