#include "data/tsv_dataset.h"

#include <algorithm>
#include <charconv>

#include "core/error.h"
#include "data/text_io.h"

namespace ember::data {

namespace {

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> fields;
  size_t start = 0;
  for (;;) {
    size_t tab = line.find('\t', start);
    fields.push_back(line.substr(start, tab == std::string::npos ? std::string::npos : tab - start));
    if (tab == std::string::npos) return fields;
    start = tab + 1;
  }
}

bool is_blank(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == ' ' || c == '\t'; });
}

std::string trim_spaces(const std::string& s) {
  size_t a = s.find_first_not_of(' ');
  if (a == std::string::npos) return {};
  return s.substr(a, s.find_last_not_of(' ') - a + 1);
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", '" : "'") + v[i] + "'";
  return out;
}

int64_t column_index(const TsvTable& table, const std::string& path, const std::string& name) {
  auto it = std::find(table.header.begin(), table.header.end(), name);
  EMBER_CHECK(it != table.header.end(), "tsv: ", path, ":1: header has no column '", name,
              "' (columns: ", join(table.header), ")");
  return int64_t(it - table.header.begin());
}

}  // namespace

TsvTable read_tsv(const std::string& path, bool has_header) {
  LineReader reader(path);
  TsvTable table;
  std::string line;
  size_t columns = 0;
  while (reader.next(line)) {
    if (is_blank(line)) continue;
    std::vector<std::string> fields = split_tabs(line);
    if (has_header && table.header.empty()) {
      table.header = std::move(fields);
      columns = table.header.size();
      continue;
    }
    if (columns == 0) columns = fields.size();
    EMBER_CHECK(fields.size() == columns, "tsv: ", path, ":", reader.line_number(), ": expected ",
                columns, " tab-separated columns, found ", fields.size());
    table.rows.push_back(std::move(fields));
    table.line_numbers.push_back(reader.line_number());
  }
  EMBER_CHECK(!has_header || !table.header.empty(), "tsv: '", path, "' is empty (expected a header line)");
  return table;
}

LabeledTexts read_labeled_tsv(const std::string& path, const LabeledTsvOptions& options) {
  TsvTable table = read_tsv(path, options.has_header);
  int64_t text_col = options.text_index, label_col = options.label_index;
  if (options.has_header) {
    text_col = column_index(table, path, options.text_column);
    label_col = column_index(table, path, options.label_column);
  }
  LabeledTexts out;
  out.texts.reserve(table.rows.size());
  out.labels.reserve(table.rows.size());
  for (size_t r = 0; r < table.rows.size(); ++r) {
    const std::vector<std::string>& row = table.rows[r];
    const int64_t line = table.line_numbers[r];
    EMBER_CHECK(text_col < int64_t(row.size()) && label_col < int64_t(row.size()), "tsv: ", path, ":",
                line, ": expected at least ", std::max(text_col, label_col) + 1, " columns, found ",
                row.size());
    std::string text = row[size_t(text_col)];
    text.erase(text.find_last_not_of(' ') + 1);  // npos + 1 == 0 clears an all-space text

    const std::string label_text = trim_spaces(row[size_t(label_col)]);
    int64_t label = -1;
    auto [end, ec] = std::from_chars(label_text.data(), label_text.data() + label_text.size(), label);
    const bool parsed = !label_text.empty() && ec == std::errc() &&
                        end == label_text.data() + label_text.size();
    // Without num_labels, labels are still class ids: a bound keeps label_counts() (a vector
    // indexed by label) from allocating petabytes for a corrupt line.
    const int64_t limit = options.num_labels > 0 ? options.num_labels : kMaxLabels;
    const bool in_range = label >= 0 && label < limit;
    EMBER_CHECK(parsed && in_range, "tsv: ", path, ":", line, ": bad label '", row[size_t(label_col)],
                "' (expected an integer in [0, ", limit, "))");
    out.texts.push_back(std::move(text));
    out.labels.push_back(label);
  }
  return out;
}

std::vector<int64_t> LabeledTexts::label_counts() const {
  std::vector<int64_t> counts;
  for (int64_t l : labels) {
    EMBER_CHECK(l >= 0 && l < kMaxLabels, "label_counts: label ", l, " is outside [0, ", kMaxLabels, ")");
    if (l >= int64_t(counts.size())) counts.resize(size_t(l) + 1, 0);
    ++counts[size_t(l)];
  }
  return counts;
}

}  // namespace ember::data
