#include "elastic_runs.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include "accelerate/heartbeat.h"

namespace ember::cli {

namespace {

using Clock = JobOutcome::Clock;

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

std::string format(const char* pattern, double value) {
  char text[64];
  std::snprintf(text, sizeof(text), pattern, value);
  return text;
}

void say(const std::string& line) {
  const std::string text = "ember launch: " + line + "\n";
  [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, text.data(), text.size());
}

// The attempt's ranks start with no heartbeat: the monitor must not read the last attempt's.
void clear_heartbeats(const std::string& dir, const std::vector<RankProcess>& ranks) {
  if (dir.empty()) return;
  std::error_code ignored;
  for (const RankProcess& r : ranks) std::filesystem::remove(distributed::heartbeat_path(dir, r.rank), ignored);
}

// How this machine's part of an attempt ended, for the other machines' launchers.
MachineOutcome machine_outcome(const JobOutcome& o) {
  if (o.status == 0) return MachineOutcome::succeeded;
  return o.interrupted || o.start_failed ? MachineOutcome::fatal : MachineOutcome::failed;
}

}  // namespace

std::string describe_attempt(const AttemptRecord& record, size_t index, const std::vector<int>& ranks) {
  const JobOutcome& o = record.outcome;
  std::string line = "attempt " + std::to_string(index + 1) + ": ";
  if (o.failure) {
    line += "rank " + std::to_string(o.failure->rank) +
            (o.failure->lost_heartbeat ? std::string(" lost its heartbeat (stopped by the launcher)")
             : o.failure->signal      ? " was killed by " + signal_name(o.failure->signal)
                                      : " exited with status " + std::to_string(o.failure->exit_code));
    for (size_t i = 0; i < ranks.size() && i < o.steps.size(); ++i)
      if (ranks[i] == o.failure->rank && o.steps[i] >= 0) line += " at step " + std::to_string(o.steps[i]);
  } else if (o.stopped_for) {
    line += "stopped for " + *o.stopped_for;
  } else if (o.interrupted) {
    line += "the launcher was interrupted (status " + std::to_string(o.status) + ")";
  } else if (o.start_failed) {
    line += "a rank could not be started (status " + std::to_string(o.status) + ")";
  } else {
    line += "every rank succeeded";
  }
  std::string steps;
  for (size_t i = 0; i < o.steps.size(); ++i)
    if (o.steps[i] >= 0) steps += (steps.empty() ? "" : ", ") + std::to_string(ranks[i]) + ": " + std::to_string(o.steps[i]);
  if (!steps.empty()) line += " (last steps by rank: " + steps + ")";
  if (record.restart_seconds >= 0) {
    line += "; started " + format("%.2f", record.restart_seconds) + " s after the previous failure";
    if (record.back_to_training_seconds >= 0)
      line += ", training again after " + format("%.2f", record.back_to_training_seconds) + " s";
  }
  return line;
}

int run_with_restarts(const SupervisorOptions& options, int max_restarts,
                      const std::function<std::vector<RankProcess>(int attempt)>& ranks_for,
                      MachineCoordinator* machines) {
  std::vector<AttemptRecord> attempts;
  std::vector<int> ranks;
  for (int attempt = 0;; ++attempt) {
    const std::vector<RankProcess> specs = ranks_for(attempt);
    ranks.clear();
    for (const RankProcess& r : specs) ranks.push_back(r.rank);
    clear_heartbeats(options.heartbeat_dir, specs);
    SupervisorOptions attempt_options = options;
    if (machines) {
      attempt_options.peer_failure = [machines, attempt] { return machines->failure(attempt); };
      attempt_options.on_failure = [machines, attempt](const std::string& how) {
        machines->report_failure(attempt, how);
      };
    }
    AttemptRecord record;
    record.outcome = supervise_ranks(attempt_options, specs);
    if (!attempts.empty() && (attempts.back().outcome.failure || attempts.back().outcome.stopped_for)) {
      const Clock::time_point failed = attempts.back().outcome.failed_at;
      record.restart_seconds = seconds_between(failed, record.outcome.started_at);
      if (record.outcome.all_training_since)
        record.back_to_training_seconds = seconds_between(failed, *record.outcome.all_training_since);
    }
    attempts.push_back(record);
    JobOutcome& o = attempts.back().outcome;
    if (machines) {
      // Every machine's launcher takes this decision alike (or throws: a machine is gone).
      const AttemptVerdict verdict = machines->finish_attempt(attempt, machine_outcome(o), attempt < max_restarts);
      if (verdict == AttemptVerdict::succeeded) break;
      if (o.status == 0) {
        // This machine's ranks finished, but another machine's did not: the job did not.
        o.status = 1;
        o.stopped_for = "a failure on another machine";
      }
      if (verdict == AttemptVerdict::stop) break;
    } else {
      const bool restartable = o.status != 0 && o.failure && !o.interrupted && !o.start_failed;
      if (!restartable || attempt == max_restarts) break;
    }
    say("restarting every rank (restart " + std::to_string(attempt + 1) + " of " + std::to_string(max_restarts) +
        "); the program resumes from its latest checkpoint");
  }
  if (max_restarts > 0 && (attempts.size() > 1 || attempts.back().outcome.status != 0)) {
    say("summary of " + std::to_string(attempts.size()) + " attempt" + (attempts.size() == 1 ? "" : "s") + " (" +
        std::to_string(attempts.size() - 1) + " restart" + (attempts.size() == 2 ? "" : "s") + " of at most " +
        std::to_string(max_restarts) + "):");
    for (size_t i = 0; i < attempts.size(); ++i) say("  " + describe_attempt(attempts[i], i, ranks));
    if (attempts.back().outcome.status != 0 && attempts.back().outcome.failure &&
        int(attempts.size()) == max_restarts + 1)
      say("giving up: the job failed " + std::to_string(attempts.size()) + " times; exit status " +
          std::to_string(attempts.back().outcome.status) + " is the last failure's");
  }
  return attempts.back().outcome.status;
}

}  // namespace ember::cli
