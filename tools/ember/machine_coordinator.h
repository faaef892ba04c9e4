// Elastic restarts across machines (`ember launch --num_machines M --max_restarts N`): the
// launchers of one job agree on every attempt through a store that machine 0's launcher serves
// at main_process_port + 1 (the ranks' own store, at main_process_port, lives only as long as
// one attempt's rank 0).
//  - A launcher whose rank fails says so at once (the first report of an attempt is kept);
//    every other launcher sees it within a fraction of a second and stops its ranks, so no rank
//    waits out a collective's timeout for a peer that is gone.
//  - After an attempt, each launcher posts how it ended and waits for every machine's word, at
//    most rdzv_timeout; a machine that does not come back within it ends the job with an
//    ember::Error naming it. With every word in, all launchers take the same decision: success,
//    restart (a failure, restarts left) or stop (restarts used up, a launcher interrupted, a
//    rank that could not be started).
#pragma once
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "accelerate/launch_config.h"
#include "distributed/store.h"

namespace ember::cli {

// How an attempt ended on one machine, as that machine's launcher saw it.
enum class MachineOutcome { succeeded = 0, failed = 1, fatal = 2 };

enum class AttemptVerdict { succeeded, restart, stop };

class MachineCoordinator {
 public:
  // Machine 0 serves the launchers' store; the others connect (retrying up to rdzv_timeout).
  explicit MachineCoordinator(const distributed::LaunchConfig& config);

  // This machine's rank failed in `attempt`; `what` says how ("rank 3 was killed by SIGKILL").
  void report_failure(int attempt, const std::string& what);
  // The failure another machine reported in `attempt`, if any ("machine 1: rank 3 was ...").
  std::optional<std::string> failure(int attempt);
  // Posts this machine's outcome and waits for every machine's; the verdict is the same on
  // every machine. An ember::Error when a machine has not posted within rdzv_timeout.
  AttemptVerdict finish_attempt(int attempt, MachineOutcome mine, bool restarts_left);

  int machine_rank() const { return machine_; }

 private:
  int machine_;
  int machines_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<distributed::Store> store_;
};

// The coordinator's port: the one after the ranks' store.
int launcher_store_port(const distributed::LaunchConfig& config);

}  // namespace ember::cli
