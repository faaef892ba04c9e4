// libFuzzer target: data::read_tsv and data::read_labeled_tsv (SST-2 layout) on arbitrary bytes
// (plain or gzip, detected from the bytes). Only ember::Error may escape the readers.
#include "data/tsv_dataset.h"
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ember::fuzz::write_temp(data, size, "tsv", ".tsv");
  try {
    auto table = ember::data::read_tsv(path, true);
    if (table.rows.size() != table.line_numbers.size()) std::abort();
    for (const auto& row : table.rows)
      if (row.size() != table.header.size()) std::abort();
  } catch (const ember::Error&) {
  }
  try {
    (void)ember::data::read_tsv(path, false);
  } catch (const ember::Error&) {
  }
  try {
    auto texts = ember::data::read_labeled_tsv(path);
    if (texts.texts.size() != texts.labels.size()) std::abort();
    for (int64_t label : texts.labels)
      if (label < 0 || label >= 2) std::abort();
    (void)texts.label_counts();
  } catch (const ember::Error&) {
  }
  try {
    ember::data::LabeledTsvOptions o;
    o.has_header = false;
    o.num_labels = 0;
    auto texts = ember::data::read_labeled_tsv(path, o);
    (void)texts.label_counts();
  } catch (const ember::Error&) {
  }
  return 0;
}
