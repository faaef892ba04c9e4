#include "accelerate/heartbeat.h"

#include <fcntl.h>
#include <unistd.h>

#include <charconv>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace ember::distributed {

std::string heartbeat_path(const std::string& dir, int rank) { return dir + "/rank_" + std::to_string(rank); }

Heartbeat::Heartbeat(int rank) {
  const char* dir = std::getenv("EMBER_HEARTBEAT_DIR");
  if (!dir || !*dir) return;
  path_ = heartbeat_path(dir, rank);
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  EMBER_CHECK(fd_ >= 0, "Accelerator: cannot write the heartbeat file ", path_, " (EMBER_HEARTBEAT_DIR): ",
              std::strerror(errno));
}

Heartbeat::~Heartbeat() {
  if (fd_ >= 0) ::close(fd_);
}

void Heartbeat::beat(int64_t step) {
  if (fd_ < 0) return;
  char text[2 * kHeartbeatWidth + 3];
  const int n = std::snprintf(text, sizeof(text), "%*lld %*lld\n", kHeartbeatWidth, static_cast<long long>(step),
                              kHeartbeatWidth, static_cast<long long>(resumed_from_));
  // Progress reporting must never stop training: a failed write is dropped.
  [[maybe_unused]] ssize_t written = ::pwrite(fd_, text, size_t(n), 0);
}

}  // namespace ember::distributed

namespace ember::distributed {

namespace {

// The next number in [*first, last), after spaces; advances *first past it.
std::optional<int64_t> next_number(const char** first, const char* last) {
  while (*first < last && **first == ' ') ++*first;
  int64_t value = 0;
  const auto [ptr, ec] = std::from_chars(*first, last, value);
  if (ec != std::errc() || ptr == *first) return std::nullopt;
  *first = ptr;
  return value;
}

}  // namespace

std::optional<HeartbeatReading> read_heartbeat(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  char text[2 * kHeartbeatWidth + 8];
  const ssize_t n = ::pread(fd, text, sizeof(text), 0);
  ::close(fd);
  if (n <= 0) return std::nullopt;
  const char* first = text;
  const char* last = text + n;
  const auto step = next_number(&first, last);
  const auto resumed = next_number(&first, last);
  if (!step || !resumed) return std::nullopt;
  return HeartbeatReading{*step, *resumed};
}

}  // namespace ember::distributed
