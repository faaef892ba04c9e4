// The trackers an Accelerator logs to (AcceleratorOptions::log_with) and the run they write:
// init_trackers -> start(), log -> log(), end_training -> finish(). Every process keeps the
// same bookkeeping (so misuse raises the same error everywhere), but only the process started
// with write=true (the main process) creates the run directory and files:
//   <project_dir>/<project_name>/config.json    the hyperparameters, one flat JSON object
//   <project_dir>/<project_name>/metrics.jsonl  "jsonl"
//   <project_dir>/<project_name>/events.out.tfevents.*  "tensorboard"
// A one-process program without an Accelerator uses it directly, with the same files:
//   TrackerGroup trackers({"jsonl", "tensorboard"});
//   trackers.start_in("runs/my_run", {{"lr", 1e-3}});
//   trackers.log({{"loss", loss}}, step);
//   trackers.finish();
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tracking/tracker.h"

namespace ember::tracking {

class TrackerGroup {
 public:
  // The tracker names log_with accepts, besides "all" (every one of them).
  static const std::vector<std::string>& known_trackers();

  // Raises ember::Error naming the known trackers when a name is not one of them.
  explicit TrackerGroup(const std::vector<std::string>& log_with);
  ~TrackerGroup();
  TrackerGroup(const TrackerGroup&) = delete;
  TrackerGroup& operator=(const TrackerGroup&) = delete;

  // The selected trackers, "all" expanded, each once, in known_trackers() order.
  const std::vector<std::string>& names() const { return names_; }

  // Starts the run `project_name` under `project_dir`. Raises when a run is active already.
  void start(const std::string& project_dir, const std::string& project_name, const TrackerConfig& config,
             bool write);
  // Starts a run that writes straight into `run_dir` (created when missing); start() is this
  // with <project_dir>/<project_name>. Raises when a run is active already.
  void start_in(const std::string& run_dir, const TrackerConfig& config, bool write = true);
  // One row at `step`, or without one at the number of earlier log() calls of this run. Raises
  // before start(), and for names that are empty, repeated or reserved ("step", "wall_time").
  void log(const LogValues& values, std::optional<int64_t> step);
  // Flushes and closes every tracker and ends the run; does nothing when no run is active.
  void finish();

  bool active() const { return active_; }
  // log() calls of the active run.
  int64_t log_calls() const { return log_calls_; }
  // The active tracker called `name`; nullptr when it was not selected or this process does
  // not write.
  Tracker* get(const std::string& name) const;
  // <project_dir>/<project_name> of the active run (empty when none).
  const std::string& run_dir() const { return run_dir_; }

 private:
  std::vector<std::string> names_;
  std::vector<std::unique_ptr<Tracker>> trackers_;
  bool active_ = false;
  int64_t log_calls_ = 0;
  std::string run_dir_;
};

}  // namespace ember::tracking
