#include "data/byte_tokenizer.h"

#include "core/error.h"
#include "data/unicode.h"

namespace ember::data {

namespace {

// Bytes gathered between end-of-text ids, as text: valid UTF-8 as it is, else with U+FFFD for
// each broken sequence.
void flush_bytes(std::string& bytes, std::string& text) {
  if (unicode::is_valid_utf8(bytes)) text += bytes;
  else text += unicode::encode_utf8(unicode::decode_utf8(bytes, unicode::InvalidUtf8::Replace));
  bytes.clear();
}

}  // namespace

std::vector<int64_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> ids;
  encode_into(text, ids);
  return ids;
}

void ByteTokenizer::encode_into(std::string_view text, std::vector<int64_t>& ids) const {
  ids.reserve(ids.size() + text.size());
  for (const char c : text) ids.push_back(int64_t(static_cast<unsigned char>(c)));
}

std::vector<int64_t> ByteTokenizer::encode_documents(const std::vector<std::string>& documents) const {
  size_t total = 0;
  for (const auto& d : documents) total += d.size() + 1;
  std::vector<int64_t> ids;
  ids.reserve(total);
  for (const auto& d : documents) {
    encode_into(d, ids);
    ids.push_back(kEndOfTextId);
  }
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int64_t>& ids) const { return decode_impl(ids, true); }

std::string ByteTokenizer::decode_skipping_end_of_text(const std::vector<int64_t>& ids) const {
  return decode_impl(ids, false);
}

std::string ByteTokenizer::decode_impl(const std::vector<int64_t>& ids, bool keep_end_of_text) const {
  std::string text, bytes;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = ids[i];
    EMBER_CHECK(id >= 0 && id < kVocabSize, "ByteTokenizer::decode: id ", id, " at position ", i,
                " is outside the vocabulary 0..", kVocabSize - 1);
    if (id < 256) {
      bytes.push_back(static_cast<char>(static_cast<unsigned char>(id)));
      continue;
    }
    // A multi-byte character cannot span the end of a document: decode what came before it.
    flush_bytes(bytes, text);
    if (keep_end_of_text) text += kEndOfTextText;
  }
  flush_bytes(bytes, text);
  return text;
}

}  // namespace ember::data
