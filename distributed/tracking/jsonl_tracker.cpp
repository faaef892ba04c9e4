#include "distributed/tracking/jsonl_tracker.h"

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace ember::distributed::tracking {

JsonlTracker::JsonlTracker(const std::string& run_dir) : path_(run_dir + "/metrics.jsonl") {
  file_ = std::fopen(path_.c_str(), "ab");
  EMBER_CHECK(file_ != nullptr, "JsonlTracker: cannot open '", path_, "' for appending: ", std::strerror(errno));
}

JsonlTracker::~JsonlTracker() {
  if (file_) std::fclose(file_);
}

std::string JsonlTracker::format_line(const LogValues& values, int64_t step, double wall_time) {
  // ordered_json keeps insertion order; nlohmann writes doubles in shortest round-trip form and
  // non-finite ones as null.
  nlohmann::ordered_json row;
  row["step"] = step;
  row["wall_time"] = wall_time;
  for (const auto& [name, value] : values) row[name] = value;
  return row.dump();
}

void JsonlTracker::log(const LogValues& values, int64_t step, double wall_time) {
  EMBER_CHECK(file_ != nullptr, "JsonlTracker: '", path_, "' is closed (log after end_training)");
  const std::string line = format_line(values, step, wall_time) + "\n";
  EMBER_CHECK(std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0,
              "JsonlTracker: writing '", path_, "' failed: ", std::strerror(errno));
}

void JsonlTracker::finish() {
  if (!file_) return;
  std::FILE* file = file_;
  file_ = nullptr;
  EMBER_CHECK(std::fclose(file) == 0, "JsonlTracker: closing '", path_, "' failed: ", std::strerror(errno));
}

}  // namespace ember::distributed::tracking
