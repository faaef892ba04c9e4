#include "tracking/jsonl_tracker.h"

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace ember::tracking {

namespace {

// How many of the first `size` bytes of `path` end with its last newline: what stays when an
// unfinished last line is dropped (0 when the file has no newline at all).
uintmax_t complete_lines_size(const std::string& path, uintmax_t size) {
  std::ifstream in(path, std::ios::binary);
  EMBER_CHECK(in, "JsonlTracker: cannot read '", path, "'");
  char chunk[4096];
  for (uintmax_t end = size; end > 0;) {
    const uintmax_t begin = end > sizeof(chunk) ? end - sizeof(chunk) : 0;
    in.seekg(std::streamoff(begin));
    in.read(chunk, std::streamsize(end - begin));
    EMBER_CHECK(in, "JsonlTracker: cannot read '", path, "'");
    for (uintmax_t i = end - begin; i-- > 0;)
      if (chunk[i] == '\n') return begin + i + 1;
    end = begin;
  }
  return 0;
}

}  // namespace

JsonlTracker::JsonlTracker(const std::string& run_dir) : path_(run_dir + "/metrics.jsonl") {
  // A resumed run appends. The cut-off last line of a killed run would otherwise be glued to
  // the first new row, leaving a malformed line inside the file; it held no complete row, so
  // it is dropped first.
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path_, ec);
  if (!ec && size > 0) {
    const uintmax_t keep = complete_lines_size(path_, size);
    if (keep != size) std::filesystem::resize_file(path_, keep, ec);
    EMBER_CHECK(!ec, "JsonlTracker: cannot drop the cut-off last line of '", path_, "': ", ec.message());
  }
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

}  // namespace ember::tracking
