#include "data/text_io.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "data/unicode.h"

namespace ember::data {

namespace {
constexpr unsigned kChunkBytes = 1u << 18;

bool is_blank(const std::string& s) {
  for (char c : s)
    if (c != ' ' && c != '\t' && c != '\r' && c != '\n' && c != '\f' && c != '\v') return false;
  return true;
}
}  // namespace

// zlib's gzFile reads gzip data and, transparently, plain files too.
struct LineReader::GzFile {
  gzFile handle = nullptr;
  ~GzFile() {
    if (handle) gzclose(handle);
  }
};

LineReader::LineReader(std::string path, InvalidUtf8Policy policy)
    : path_(std::move(path)), policy_(policy), file_(std::make_unique<GzFile>()) {
  std::error_code ec;
  EMBER_CHECK(std::filesystem::exists(path_, ec), "text_io: cannot open '", path_, "': file not found");
  EMBER_CHECK(!std::filesystem::is_directory(path_, ec), "text_io: cannot open '", path_,
              "': it is a directory");
  errno = 0;
  file_->handle = gzopen(path_.c_str(), "rb");
  EMBER_CHECK(file_->handle != nullptr, "text_io: cannot open '", path_, "': ",
              errno ? std::strerror(errno) : "out of memory");
  gzbuffer(file_->handle, kChunkBytes);
}

LineReader::~LineReader() = default;
LineReader::LineReader(LineReader&&) noexcept = default;
LineReader& LineReader::operator=(LineReader&&) noexcept = default;

bool LineReader::fill() {
  if (eof_) return false;
  if (pos_ > 0) {  // keep only the unread tail
    buffer_.erase(0, pos_);
    pos_ = 0;
  }
  const size_t old = buffer_.size();
  buffer_.resize(old + kChunkBytes);
  int got = gzread(file_->handle, buffer_.data() + old, kChunkBytes);
  if (got < 0) {
    int err = 0;
    const char* msg = gzerror(file_->handle, &err);
    EMBER_FAIL("text_io: cannot read '", path_, "' (corrupt gzip data?): ", msg);
  }
  buffer_.resize(old + size_t(got));
  if (got == 0) {
    eof_ = true;
    int err = Z_OK;
    gzerror(file_->handle, &err);
    EMBER_CHECK(err == Z_OK, "text_io: '", path_, "' is truncated (the gzip stream ends early)");
    return false;
  }
  return true;
}

bool LineReader::next(std::string& line) {
  size_t from = pos_;
  size_t nl;
  while ((nl = buffer_.find('\n', from)) == std::string::npos) {
    const size_t scanned = buffer_.size() - pos_;  // fill() moves the unread tail to offset 0
    if (!fill()) break;
    from = pos_ + scanned;
  }
  if (nl == std::string::npos) {
    if (pos_ >= buffer_.size()) return false;
    nl = buffer_.size();  // last line without a newline
  }
  line.assign(buffer_, pos_, nl - pos_);
  pos_ = std::min(nl + 1, buffer_.size());
  if (!line.empty() && line.back() == '\r') line.pop_back();
  ++line_number_;
  if (line_number_ == 1 && line.compare(0, 3, "\xEF\xBB\xBF") == 0) line.erase(0, 3);
  if (!unicode::is_valid_utf8(line)) {
    EMBER_CHECK(policy_ == InvalidUtf8Policy::Latin1, "text_io: ", path_, ":", line_number_,
                ": not valid UTF-8");
    line = latin1_fallback_to_utf8(line, &latin1_bytes_);
  }
  return true;
}

std::vector<std::string> read_lines(const std::string& path, bool skip_blank, InvalidUtf8Policy policy) {
  LineReader reader(path, policy);
  std::vector<std::string> lines;
  std::string line;
  while (reader.next(line))
    if (!skip_blank || !is_blank(line)) lines.push_back(line);
  return lines;
}

void write_text_file(const std::string& path, std::string_view content, bool gzip) {
  errno = 0;
  gzFile f = gzopen(path.c_str(), gzip ? "wb9" : "wbT");  // "T": plain, uncompressed output
  EMBER_CHECK(f != nullptr, "text_io: cannot write '", path, "': ", errno ? std::strerror(errno) : "out of memory");
  size_t done = 0;
  while (done < content.size()) {
    const unsigned n = unsigned(std::min<size_t>(content.size() - done, kChunkBytes));
    if (gzwrite(f, content.data() + done, n) != int(n)) {
      int err = 0;
      std::string msg = gzerror(f, &err);
      gzclose(f);
      EMBER_FAIL("text_io: cannot write '", path, "': ", msg);
    }
    done += n;
  }
  EMBER_CHECK(gzclose(f) == Z_OK, "text_io: cannot finish writing '", path, "'");
}

std::string latin1_fallback_to_utf8(const std::string& bytes, int64_t* latin1_bytes) {
  if (unicode::is_valid_utf8(bytes)) return bytes;
  size_t invalid = 0;
  std::string out = unicode::encode_utf8(unicode::decode_utf8(bytes, unicode::InvalidUtf8::Latin1, &invalid));
  if (latin1_bytes) *latin1_bytes += int64_t(invalid);
  return out;
}

}  // namespace ember::data
