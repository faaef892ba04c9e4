// The "tensorboard" tracker: a TensorBoard event file in the run directory,
//   events.out.tfevents.<unix seconds>.<hostname>.<pid>.<n>
// (n: the first number that names no existing file). TFRecord-framed tensorflow.Event
// messages, encoded by hand (field numbers of tensorflow/core/util/event.proto and
// summary.proto): first an Event with only wall_time and file_version "brain.Event:2", then
// the configuration as a text summary (tag "config", a markdown table, step 0), then one Event
// per log() call whose Summary holds one simple_value (float) per scalar. Flushed after every
// event so a running TensorBoard sees it at once.
#pragma once
#include <memory>
#include <string>

#include "tracking/tfrecord_writer.h"
#include "tracking/tracker.h"

namespace ember::tracking {

class TensorBoardTracker : public Tracker {
 public:
  explicit TensorBoardTracker(const std::string& run_dir);

  std::string name() const override { return "tensorboard"; }
  std::string path() const override { return writer_->path(); }
  void store_init_configuration(const TrackerConfig& config) override;
  void log(const LogValues& values, int64_t step, double wall_time) override;
  void finish() override;

  // The encoded Event messages (without TFRecord framing).
  static std::string file_version_event(double wall_time);
  static std::string scalars_event(const LogValues& values, int64_t step, double wall_time);
  static std::string text_event(const std::string& tag, const std::string& text, int64_t step, double wall_time);
  // The config as the markdown table the text summary shows.
  static std::string config_table(const TrackerConfig& config);

 private:
  void write_event(const std::string& event);

  std::unique_ptr<TFRecordWriter> writer_;
};

}  // namespace ember::tracking
