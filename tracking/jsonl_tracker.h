// The "jsonl" tracker: <run dir>/metrics.jsonl, one JSON object per log() call,
//   {"step":12,"wall_time":1764561234.123,"loss":2.31,"lr":0.0001}
// keys "step", "wall_time", then the values in the order given. Doubles are written in their
// shortest round-trip form, NaN and infinities as null. The file is opened for appending (a
// resumed run continues it) and flushed after every line, so a killed run loses at most the
// line being written; the next run drops that cut-off line before appending.
#pragma once
#include <cstdio>
#include <string>

#include "tracking/tracker.h"

namespace ember::tracking {

class JsonlTracker : public Tracker {
 public:
  explicit JsonlTracker(const std::string& run_dir);
  ~JsonlTracker() override;

  std::string name() const override { return "jsonl"; }
  std::string path() const override { return path_; }
  // Hyperparameters live in the run's config.json; nothing goes into the metrics file.
  void store_init_configuration(const TrackerConfig&) override {}
  void log(const LogValues& values, int64_t step, double wall_time) override;
  void finish() override;

  // The line log() writes, without its newline.
  static std::string format_line(const LogValues& values, int64_t step, double wall_time);

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace ember::tracking
