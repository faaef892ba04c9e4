// Starts the local ranks of a job and looks after them until they are all gone:
//  - every rank runs in its own process group, with stdin from /dev/null and its stdout and
//    stderr read through pipes; each line is re-emitted whole, prefixed "[rank R] ", on the
//    launcher's stdout or stderr (a last line without a newline is completed at exit; a line
//    longer than 1 MiB is emitted in 1 MiB pieces); carriage returns are resolved to what a
//    terminal shows: a line redrawn in place with "\r" (a progress bar) is redrawn in place
//    behind its prefix when the launcher's own stream is a terminal, other output clearing it
//    first and drawing it again after, and only its final state is written anywhere else;
//  - SIGINT, SIGTERM and SIGHUP sent to the launcher are forwarded to every rank's process
//    group; a second one kills the ranks at once;
//  - when a rank exits non-zero or by a signal, the others get SIGTERM and, after the grace
//    period, SIGKILL; the launcher's status is that rank's (128 + signal for a signal);
//  - a rank dies with SIGKILL if the launcher itself dies abruptly;
//  - with a heartbeat directory, the ranks' progress is watched (progress_monitor.h); with a
//    heartbeat timeout too, a rank silent that long counts as failed (status 1) and the
//    others are stopped as above.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace ember::cli {

struct RankProcess {
  int rank = 0;                      // global rank, used in the output prefix
  std::vector<std::string> environment;  // complete, "NAME=value"
};

struct SupervisorOptions {
  std::string program;             // path of the executable
  std::vector<std::string> argv;   // argv[0] included
  std::chrono::milliseconds grace{std::chrono::seconds(5)};
  // Where the ranks write their heartbeats (EMBER_HEARTBEAT_DIR); empty: no monitoring.
  std::string heartbeat_dir;
  std::chrono::milliseconds monitor_interval{std::chrono::seconds(5)};
  std::chrono::milliseconds heartbeat_timeout{0};  // 0: a silent rank is only named
  // A job on several machines (machine_coordinator.h): asked a few times a second whether a
  // rank elsewhere failed, which stops the ranks here too (its answer says which, and how);
  // and told at once when a rank here fails ("rank 3 was killed by SIGKILL").
  std::function<std::optional<std::string>()> peer_failure;
  std::function<void(const std::string&)> on_failure;
};

// How a job of ranks ended.
struct JobOutcome {
  using Clock = std::chrono::steady_clock;
  int status = 0;            // the launcher's exit status
  bool interrupted = false;  // the launcher was signalled (Ctrl-C, SIGTERM, SIGHUP)
  bool start_failed = false; // a rank could not be started
  // The first rank that failed: its global rank, and its exit code or the signal that killed it.
  struct Failure {
    int rank = 0;
    int exit_code = 0;
    int signal = 0;  // non-zero: killed by it
    bool lost_heartbeat = false;  // stopped by the launcher: no progress for the heartbeat timeout
  };
  std::optional<Failure> failure;
  // The ranks were stopped because a rank on another machine failed: that machine's report.
  std::optional<std::string> stopped_for;
  Clock::time_point started_at{};  // before the first rank was started
  Clock::time_point failed_at{};   // when the failure was seen
  std::vector<int64_t> steps;      // each rank's last heartbeat, in start order (-1: none)
  std::optional<Clock::time_point> all_training_since;  // see ProgressMonitor
};

// Runs the ranks to completion and says how they ended. Should one fail to start
// (a pipe or fork refused, the program not executable), or a signal or a failing rank stop the
// job while ranks are still being started, no further rank is started and those running are
// stopped as above.
JobOutcome supervise_ranks(const SupervisorOptions& options, const std::vector<RankProcess>& ranks);

// "SIGKILL", or "signal 70" for one without a name.
std::string signal_name(int sig);

// The read ends of a running rank's stdout and stderr pipes, held by the launcher.
inline constexpr int kDescriptorsPerRank = 2;

// File descriptors supervise_ranks opens for `ranks` ranks at most, on top of those already
// open: its signal pipe, kDescriptorsPerRank per rank and, while the last rank starts, the write
// ends of its pipes, its exec-status pipe and the /dev/null its child opens for stdin.
constexpr long long supervisor_descriptors(long long ranks) { return 2 + kDescriptorsPerRank * ranks + 4 + 1; }

}  // namespace ember::cli
