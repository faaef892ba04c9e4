// Appends TFRecord-framed records to a file: for each record the payload length (uint64,
// little-endian), the masked CRC32C of those 8 bytes, the payload, and the masked CRC32C of the
// payload. This is the container of TensorBoard event files; a reader that finds a record cut
// short (a killed writer) sees a bad length or checksum and stops before it.
#pragma once
#include <cstdio>
#include <string>
#include <string_view>

namespace ember::tracking {

class TFRecordWriter {
 public:
  // Creates `path`; raises ember::Error when it exists already or cannot be created.
  explicit TFRecordWriter(std::string path);
  ~TFRecordWriter();
  TFRecordWriter(const TFRecordWriter&) = delete;
  TFRecordWriter& operator=(const TFRecordWriter&) = delete;

  // Writes one framed record; the bytes reach the OS after flush().
  void write(std::string_view record);
  void flush();
  // Flushes and closes; later calls do nothing.
  void close();

  const std::string& path() const { return path_; }
  // The framing of one record as it appears in the file.
  static std::string frame(std::string_view record);

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace ember::tracking
