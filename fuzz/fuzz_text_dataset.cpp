// libFuzzer target: the text readers behind the pretraining dataset on arbitrary bytes:
// data::LineReader / read_lines (plain or gzip, CRLF, BOM, Latin-1 fallback, strict UTF-8) and
// data::PackedTextDataset over the file. Only ember::Error may escape the readers.
#include "data/text_datasets.h"
#include "data/text_io.h"
#include "data/wordpiece_tokenizer.h"
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ember::data::WordPieceTokenizer tok(
      std::vector<std::string>{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "a", "film", "is", "good", "##s",
                               ".", ","},
      "fuzz vocabulary");
  const std::string path = ember::fuzz::write_temp(data, size, "text", ".txt");
  try {
    auto lines = ember::data::read_lines(path, false);
    auto kept = ember::data::read_lines(path, true);
    if (kept.size() > lines.size()) std::abort();
  } catch (const ember::Error&) {
  }
  try {
    (void)ember::data::read_lines(path, false, ember::data::InvalidUtf8Policy::Error);
  } catch (const ember::Error&) {
  }
  try {
    ember::data::PackedTextDataset ds(tok, {path}, 8, 64);
    for (int64_t i = 0; i < ds.size(); ++i) (void)ds.get(i);
  } catch (const ember::Error&) {
  }
  return 0;
}
