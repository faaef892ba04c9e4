#include "tracking/tfrecord_writer.h"

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "core/error.h"
#include "tracking/crc32c.h"

namespace ember::tracking {

namespace {

void append_little_endian(std::string& out, uint64_t value, int size) {
  for (int i = 0; i < size; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

}  // namespace

TFRecordWriter::TFRecordWriter(std::string path) : path_(std::move(path)) {
  // "x": never overwrite an existing event file (two writers must not share one).
  file_ = std::fopen(path_.c_str(), "wbx");
  EMBER_CHECK(file_ != nullptr, "TFRecordWriter: cannot create '", path_, "': ", std::strerror(errno));
}

TFRecordWriter::~TFRecordWriter() {
  if (file_) std::fclose(file_);
}

std::string TFRecordWriter::frame(std::string_view record) {
  std::string length;
  append_little_endian(length, record.size(), 8);
  std::string out = length;
  append_little_endian(out, masked_crc32c(length), 4);
  out.append(record);
  append_little_endian(out, masked_crc32c(record), 4);
  return out;
}

void TFRecordWriter::write(std::string_view record) {
  EMBER_CHECK(file_ != nullptr, "TFRecordWriter: '", path_, "' is closed");
  const std::string framed = frame(record);
  EMBER_CHECK(std::fwrite(framed.data(), 1, framed.size(), file_) == framed.size(), "TFRecordWriter: writing '",
              path_, "' failed: ", std::strerror(errno));
}

void TFRecordWriter::flush() {
  if (!file_) return;
  EMBER_CHECK(std::fflush(file_) == 0, "TFRecordWriter: flushing '", path_, "' failed: ", std::strerror(errno));
}

void TFRecordWriter::close() {
  if (!file_) return;
  std::FILE* file = file_;
  file_ = nullptr;
  EMBER_CHECK(std::fclose(file) == 0, "TFRecordWriter: closing '", path_, "' failed: ", std::strerror(errno));
}

}  // namespace ember::tracking
