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
//  - a rank dies with SIGKILL if the launcher itself dies abruptly.
#pragma once
#include <chrono>
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
};

// Runs the ranks to completion and returns the launcher's exit status. Should one fail to start
// (a pipe or fork refused, the program not executable), or a signal or a failing rank stop the
// job while ranks are still being started, no further rank is started and those running are
// stopped as above.
int supervise_ranks(const SupervisorOptions& options, const std::vector<RankProcess>& ranks);

// The read ends of a running rank's stdout and stderr pipes, held by the launcher.
inline constexpr int kDescriptorsPerRank = 2;

// File descriptors supervise_ranks opens for `ranks` ranks at most, on top of those already
// open: its signal pipe, kDescriptorsPerRank per rank and, while the last rank starts, the write
// ends of its pipes, its exec-status pipe and the /dev/null its child opens for stdin.
constexpr long long supervisor_descriptors(long long ranks) { return 2 + kDescriptorsPerRank * ranks + 4 + 1; }

}  // namespace ember::cli
