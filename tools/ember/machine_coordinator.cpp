#include "machine_coordinator.h"

#include <cmath>
#include <cstdio>
#include <thread>
#include <vector>

#include "core/error.h"
#include "distributed/rendezvous.h"

namespace ember::cli {

namespace {

using Clock = std::chrono::steady_clock;

std::string attempt_key(int attempt, const std::string& what) {
  return "ember/launchers/attempt_" + std::to_string(attempt) + "/" + what;
}

std::string seconds_text(std::chrono::milliseconds d) {
  const double s = std::chrono::duration<double>(d).count();
  char text[32];
  std::snprintf(text, sizeof(text), "%g", s);
  return text;
}

}  // namespace

int launcher_store_port(const distributed::LaunchConfig& config) { return config.main_process_port + 1; }

MachineCoordinator::MachineCoordinator(const distributed::LaunchConfig& config)
    : machine_(config.machine_rank),
      machines_(config.num_machines),
      timeout_(std::chrono::milliseconds(std::llround(config.rdzv_timeout * 1000))) {
  EMBER_CHECK(launcher_store_port(config) <= 65535, "ember launch: --max_restarts with --num_machines needs ",
              "main_process_port + 1 for the launchers' store, but main_process_port is ", config.main_process_port);
  distributed::RendezvousInfo launchers;
  launchers.rank = machine_;
  launchers.world_size = machines_;
  launchers.local_rank = 0;
  launchers.local_world_size = 1;
  launchers.master_addr = config.main_process_ip;
  launchers.master_port = launcher_store_port(config);
  store_ = distributed::connect_store(launchers, timeout_);
  // Every launcher is there before the first rank starts: a machine that never came is named
  // now, not as a rank's rendezvous timeout.
  distributed::rendezvous_barrier(*store_, machine_, machines_, timeout_, "ember/launchers/start");
}

void MachineCoordinator::report_failure(int attempt, const std::string& what) {
  // The first report wins: the others are usually ranks that lost that one's connections.
  if (store_->add(attempt_key(attempt, "failures"), 1) == 1)
    store_->set_string(attempt_key(attempt, "failure"), "machine " + std::to_string(machine_) + ": " + what);
}

std::optional<std::string> MachineCoordinator::failure(int attempt) {
  const std::string key = attempt_key(attempt, "failure");
  if (!store_->check({key})) return std::nullopt;
  return store_->get_string(key);
}

AttemptVerdict MachineCoordinator::finish_attempt(int attempt, MachineOutcome mine, bool restarts_left) {
  store_->set_string(attempt_key(attempt, "outcome_" + std::to_string(machine_)), std::to_string(int(mine)));
  std::vector<std::string> keys;
  for (int m = 0; m < machines_; ++m) keys.push_back(attempt_key(attempt, "outcome_" + std::to_string(m)));
  const auto deadline = Clock::now() + timeout_;
  while (!store_->check(keys)) {
    if (Clock::now() >= deadline) {
      std::string missing;
      for (int m = 0; m < machines_; ++m)
        if (!store_->check({keys[size_t(m)]})) missing += (missing.empty() ? "" : ", ") + std::to_string(m);
      EMBER_FAIL("ember launch: machine ", missing, " did not come back within ", seconds_text(timeout_),
                 " s (--rdzv_timeout) after attempt ", attempt + 1,
                 " ended; the job ends here (is its launcher still running?)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  bool failed = false, fatal = false;
  for (const auto& key : keys) {
    const std::string outcome = store_->get_string(key);
    failed = failed || outcome != std::to_string(int(MachineOutcome::succeeded));
    fatal = fatal || outcome == std::to_string(int(MachineOutcome::fatal));
  }
  // Machine 0 serves the store: it leaves only once every launcher has read the outcomes.
  store_->add(attempt_key(attempt, "read"), 1);
  if (machine_ == 0) {
    const auto until = Clock::now() + std::chrono::seconds(10);
    while (store_->add(attempt_key(attempt, "read"), 0) < machines_ && Clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!failed) return AttemptVerdict::succeeded;
  return !fatal && restarts_left ? AttemptVerdict::restart : AttemptVerdict::stop;
}

}  // namespace ember::cli
