// `ember launch --max_restarts N`: when a rank fails, the supervisor stops the others; then every
// rank is started again (EMBER_RESTART_COUNT = 1, 2, ...) and the program resumes from its
// latest checkpoint (Accelerator::load_state()). Each attempt's rank 0 serves a new store, so a
// restart rendezvouses afresh with no stale keys. After N restarts, or when the launcher itself
// was signalled or a rank could not be started, the last attempt's status is the launcher's and
// a summary of every attempt (who failed, how, at which step, how long the restart took) is
// written to stderr.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "machine_coordinator.h"
#include "rank_supervisor.h"

namespace ember::cli {

struct AttemptRecord {
  JobOutcome outcome;
  // From the previous attempt's failure to this attempt's first rank start, and to every rank
  // training (a backward pass after its resume); negative when not measured.
  double restart_seconds = -1;
  double back_to_training_seconds = -1;
};

// One line per attempt, as the summary prints them.
std::string describe_attempt(const AttemptRecord& record, size_t index, const std::vector<int>& ranks);

// Runs attempts until one succeeds, the launcher is interrupted, a rank cannot start, or
// max_restarts restarts have failed. `ranks_for(attempt)` builds the ranks of attempt 0, 1, ...
// With `machines` (a job on several machines), a failure anywhere stops every machine's ranks
// and every machine's launcher takes the same decision after each attempt.
int run_with_restarts(const SupervisorOptions& options, int max_restarts,
                      const std::function<std::vector<RankProcess>(int attempt)>& ranks_for,
                      MachineCoordinator* machines = nullptr);

}  // namespace ember::cli
