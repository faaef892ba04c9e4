// Crash-safe file writing: a file is built under a temporary name in its final directory and
// renamed into place only once complete and flushed, so readers (and a crash or full disk
// halfway through) see either the old file or the whole new one, never a torn write.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace ember::nn {

// Writes all `n` bytes to `fd`, retrying short and interrupted writes. Any failure (disk full,
// file too large, I/O error) raises ember::Error naming `path` and the system's reason.
void write_all(int fd, const void* data, size_t n, const std::string& path);

class AtomicFile {
 public:
  // Creates "<dir of path>/.<name of path>.tmp-<pid>-<n>"; raises ember::Error naming `path`
  // when the directory is missing or not writable.
  explicit AtomicFile(std::string path);
  // Removes the temporary file unless commit() succeeded.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);
  void write(std::string_view bytes) { write(bytes.data(), bytes.size()); }

  // fsyncs the data, closes, renames over the final path, then fsyncs the directory so the
  // rename itself survives a power loss. After a failure the old file (if any) is untouched.
  void commit();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }

 private:
  void discard() noexcept;

  std::string path_;
  std::string temp_path_;
  int fd_ = -1;
  bool committed_ = false;
};

// Replaces `path` with `contents` atomically (see AtomicFile).
void write_file_atomically(const std::string& path, std::string_view contents);

}  // namespace ember::nn
