// libFuzzer target: data::WordPieceTokenizer on arbitrary bytes. The first byte picks the mode:
//   even: the rest is text, tokenized and encoded (single and pair) with a small fixed vocabulary;
//   odd:  the rest is a vocab.txt, loaded with from_file and then used on a fixed sentence.
#include <string>
#include <string_view>
#include <vector>

#include "data/wordpiece_tokenizer.h"
#include "fuzz/fuzz_common.h"

namespace {
const ember::data::WordPieceTokenizer& fixed_tokenizer() {
  static const ember::data::WordPieceTokenizer tok(
      std::vector<std::string>{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "a", "film", "is", "good", "##s",
                               "##ing", "un", "##believ", "##able", ".", ",", "!", "'", "n", "##t", "é", "中", "##é"},
      "fuzz vocabulary");
  return tok;
}

void exercise(const ember::data::WordPieceTokenizer& tok, std::string_view text) {
  auto pieces = tok.tokenize(text);
  auto ids = tok.convert_tokens_to_ids(pieces);
  (void)tok.decode(ids);
  ember::data::EncodeOptions o;
  o.max_length = 16;
  o.pad_to_max_length = true;
  auto e = tok.encode(text, o);
  if (e.size() != 16) std::abort();
  const size_t half = text.size() / 2;
  auto p = tok.encode_pair(text.substr(0, half), text.substr(half), o);
  if (p.size() != 16) std::abort();
  for (int64_t id : p.input_ids)
    if (id < 0 || id >= tok.vocab_size()) std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    if ((data[0] & 1) == 0) {
      exercise(fixed_tokenizer(), rest);
    } else {
      const std::string path = ember::fuzz::write_temp(data + 1, size - 1, "vocab", ".txt");
      auto tok = ember::data::WordPieceTokenizer::from_file(path);
      exercise(tok, "The film isn't unbelievable, é中!");
    }
  } catch (const ember::Error&) {
  }
  return 0;
}
