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

// Runs the ranks to completion and returns the launcher's exit status.
int supervise_ranks(const SupervisorOptions& options, const std::vector<RankProcess>& ranks);

}  // namespace ember::cli
