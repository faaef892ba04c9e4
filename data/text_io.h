// Reading text files line by line, plain or gzip-compressed (detected from the bytes, not the
// file name), with the line-ending and encoding quirks of real corpora handled once here:
//  - "\n" and "\r\n" both end a line; a final line without a newline is still a line.
//  - A UTF-8 byte-order mark at the start of the file is dropped.
//  - Bytes that are not valid UTF-8 are, by default, read as Latin-1 (each stray byte becomes the
//    code point of the same value, re-encoded as UTF-8), so old ISO-8859-1 texts load without
//    losing a character; InvalidUtf8::Error makes them an error naming file and line instead.
// Errors (missing file, directory, corrupt or truncated gzip, invalid UTF-8 in strict mode)
// are ember::Error naming the file.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ember::data {

enum class InvalidUtf8Policy {
  Latin1,  // decode stray bytes as Latin-1 code points
  Error,   // throw ember::Error "<file>:<line>: not valid UTF-8"
};

class LineReader {
 public:
  explicit LineReader(std::string path, InvalidUtf8Policy policy = InvalidUtf8Policy::Latin1);
  ~LineReader();
  LineReader(LineReader&&) noexcept;
  LineReader& operator=(LineReader&&) noexcept;
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // Reads the next line (without its line ending) into `line`; false at end of file.
  bool next(std::string& line);
  // 1-based number of the line last returned by next() (0 before the first).
  int64_t line_number() const { return line_number_; }
  const std::string& path() const { return path_; }
  // Bytes so far that were not valid UTF-8 and were read as Latin-1.
  int64_t latin1_bytes() const { return latin1_bytes_; }

 private:
  bool fill();  // reads more bytes into buffer_; false at end of file

  struct GzFile;
  std::string path_;
  InvalidUtf8Policy policy_;
  std::unique_ptr<GzFile> file_;
  std::string buffer_;
  size_t pos_ = 0;
  bool eof_ = false;
  int64_t line_number_ = 0;
  int64_t latin1_bytes_ = 0;
};

// All lines of a file (see LineReader); skip_blank drops lines that are empty or all whitespace.
std::vector<std::string> read_lines(const std::string& path, bool skip_blank = false,
                                    InvalidUtf8Policy policy = InvalidUtf8Policy::Latin1);

// Writes `content` to `path` as it is, or gzip-compressed (level 9) when `gzip` is set.
void write_text_file(const std::string& path, std::string_view content, bool gzip = false);

// Re-encodes bytes that are not valid UTF-8 as Latin-1 code points (valid input is unchanged).
// Returns the number of bytes so decoded through `latin1_bytes` when given.
std::string latin1_fallback_to_utf8(const std::string& bytes, int64_t* latin1_bytes = nullptr);

}  // namespace ember::data
