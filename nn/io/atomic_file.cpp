#include "nn/io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace ember::nn {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

// Splits "a/b/c.bin" into "a/b" and "c.bin"; a bare name lives in ".".
std::pair<std::string, std::string> split_path(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return {".", path};
  return {slash == 0 ? "/" : path.substr(0, slash), path.substr(slash + 1)};
}

// Makes the rename durable. Some filesystems cannot fsync a directory; they report EINVAL or
// ENOTSUP, and there is nothing more to do on them.
void sync_directory(const std::string& dir, const std::string& path) {
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  EMBER_CHECK(dfd >= 0, "cannot open directory '", dir, "' to flush the rename of '", path, "': ",
              errno_text(errno));
  const int rc = ::fsync(dfd);
  const int err = errno;
  ::close(dfd);
  EMBER_CHECK(rc == 0 || err == EINVAL || err == ENOTSUP || err == EOPNOTSUPP,
              "cannot flush directory '", dir, "' after writing '", path, "': ", errno_text(err));
}

}  // namespace

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    // Linux moves at most ~2 GiB per call; the loop handles the rest.
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      EMBER_FAIL("error writing '", path, "': ", errno_text(errno));
    }
    EMBER_CHECK(w > 0, "error writing '", path, "': the write made no progress");
    p += w;
    n -= size_t(w);
  }
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  EMBER_CHECK(!path_.empty() && path_.back() != '/', "cannot write '", path_,
              "': the path names no file");
  const auto [dir, name] = split_path(path_);
  static std::atomic<uint64_t> counter{0};
  int err = 0;
  // O_EXCL makes the name ours; a clash (a stale file from an earlier process with the same pid)
  // moves on to the next number.
  for (int attempt = 0; attempt < 100; ++attempt) {
    temp_path_ = (dir == "/" ? "" : dir) + "/." + name + ".tmp-" + std::to_string(::getpid()) + "-" +
                 std::to_string(counter.fetch_add(1));
    fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ >= 0) return;
    err = errno;
    if (err != EEXIST) break;
  }
  temp_path_.clear();
  EMBER_FAIL("cannot create a temporary file in '", dir, "' to write '", path_, "': ", errno_text(err));
}

AtomicFile::~AtomicFile() {
  if (!committed_) discard();
}

void AtomicFile::discard() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!temp_path_.empty()) ::unlink(temp_path_.c_str());
  temp_path_.clear();
}

void AtomicFile::write(const void* data, size_t n) {
  EMBER_CHECK(fd_ >= 0 && !committed_, "cannot write '", path_, "': the file is already closed");
  write_all(fd_, data, n, path_);
}

void AtomicFile::commit() {
  EMBER_CHECK(fd_ >= 0 && !committed_, "cannot commit '", path_, "': the file is already closed");
  EMBER_CHECK(::fsync(fd_) == 0, "error flushing '", path_, "' to disk: ", errno_text(errno));
  // close() can report delayed write errors (NFS, quotas); losing them would lose data silently.
  const int rc = ::close(fd_);
  fd_ = -1;
  EMBER_CHECK(rc == 0, "error closing '", path_, "': ", errno_text(errno));
  EMBER_CHECK(::rename(temp_path_.c_str(), path_.c_str()) == 0, "cannot move the finished file into "
              "place at '", path_, "': ", errno_text(errno));
  committed_ = true;
  temp_path_.clear();
  sync_directory(split_path(path_).first, path_);
}

void write_file_atomically(const std::string& path, std::string_view contents) {
  AtomicFile file(path);
  file.write(contents);
  file.commit();
}

}  // namespace ember::nn
