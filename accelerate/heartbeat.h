// A rank's progress, as `ember launch` watches it: when the launcher sets EMBER_HEARTBEAT_DIR,
// every Accelerator::backward writes the run's backward-pass count, then the count it resumed
// from (load_state), into <dir>/rank_<RANK> (one pwrite of two fixed-width decimals, so `cat`
// shows them), and the launcher's
// monitor reads those files to say which rank stopped making progress and how far every attempt
// got. Without the variable nothing is written.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace ember::distributed {

class Heartbeat {
 public:
  // Opens the file when EMBER_HEARTBEAT_DIR is set; a directory that cannot be written is an
  // ember::Error naming it.
  explicit Heartbeat(int rank);
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  bool enabled() const { return fd_ >= 0; }
  // The count the run resumed from: a step above it means the rank is training again.
  void set_resumed_from(int64_t step) { resumed_from_ = step; }
  void beat(int64_t step);

 private:
  int fd_ = -1;
  int64_t resumed_from_ = 0;
  std::string path_;
};

// The file a rank's heartbeat goes to under `dir`.
std::string heartbeat_path(const std::string& dir, int rank);
// The width of each number: every write has the same size, so a reader never sees a shorter
// number's leftovers.
inline constexpr int kHeartbeatWidth = 20;

struct HeartbeatReading {
  int64_t step = 0;
  int64_t resumed_from = 0;
};
// What a heartbeat file says, or nullopt when it is missing or not written yet.
std::optional<HeartbeatReading> read_heartbeat(const std::string& path);

}  // namespace ember::distributed
