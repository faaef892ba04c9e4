// Tab-separated text files: generic rows, and labelled sentences in the GLUE layout
// (SST-2: a header "sentence\tlabel", then "<text> \t<0|1>" per line).
//
// Reading goes through LineReader (data/text_io.h): plain or gzip, LF or CRLF, stray Latin-1
// bytes decoded to UTF-8. Blank lines are skipped. Every row must have the header's number of
// columns (or the first row's, without a header); a row that does not, or a label that is not
// an integer in range, raises ember::Error naming the file and the line number.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ember::data {

struct TsvTable {
  std::vector<std::string> header;             // empty when the file has no header
  std::vector<std::vector<std::string>> rows;  // fields as written, split on tabs
  std::vector<int64_t> line_numbers;           // 1-based file line of each row
};

TsvTable read_tsv(const std::string& path, bool has_header = true);

// The most classes a label column may name when LabeledTsvOptions::num_labels is not set.
inline constexpr int64_t kMaxLabels = int64_t(1) << 24;

struct LabeledTsvOptions {
  bool has_header = true;
  // With a header the columns are found by name, otherwise by position.
  std::string text_column = "sentence";
  std::string label_column = "label";
  int64_t text_index = 0;
  int64_t label_index = 1;
  // Labels must be integers in [0, num_labels); num_labels <= 0 requires them to be in
  // [0, kMaxLabels).
  int64_t num_labels = 2;
};

// Sentences with integer class labels. Trailing spaces of the text are stripped (SST-2 writes
// one before every tab); the text is otherwise kept as it is.
struct LabeledTexts {
  std::vector<std::string> texts;
  std::vector<int64_t> labels;
  int64_t size() const { return int64_t(texts.size()); }
  // How many examples carry each label 0..max label.
  std::vector<int64_t> label_counts() const;
};

LabeledTexts read_labeled_tsv(const std::string& path, const LabeledTsvOptions& options = {});

}  // namespace ember::data
