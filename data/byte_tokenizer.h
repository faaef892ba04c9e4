// A byte-level tokenizer anyone can reproduce without a vocabulary file: every byte of the
// UTF-8 text is its own token (ids 0..255, the byte's value), and id 256 marks the end of a
// document (GPT-2's <|endoftext|>), so the vocabulary has 257 ids.
//
// decode() reads the bytes back as UTF-8. Text that came from encode() comes back exactly;
// bytes a model sampled need not be valid UTF-8, and each maximal invalid subpart becomes one
// U+FFFD (Python's bytes.decode("utf-8", errors="replace")), so decoding never fails on bytes.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ember::data {

class ByteTokenizer {
 public:
  static constexpr int64_t kEndOfTextId = 256;
  static constexpr int64_t kVocabSize = 257;
  // What decode() writes for the end-of-text id.
  static constexpr std::string_view kEndOfTextText = "<|endoftext|>";

  int64_t vocab_size() const { return kVocabSize; }
  int64_t end_of_text_id() const { return kEndOfTextId; }

  // The bytes of `text` as ids 0..255 (no end-of-text id is added).
  std::vector<int64_t> encode(std::string_view text) const;
  // Appends the ids of `text` to `ids`.
  void encode_into(std::string_view text, std::vector<int64_t>& ids) const;
  // The documents' ids, each followed by the end-of-text id.
  std::vector<int64_t> encode_documents(const std::vector<std::string>& documents) const;

  // Ids back to text: bytes read as UTF-8 (invalid subparts as U+FFFD), the end-of-text id as
  // kEndOfTextText. An id outside 0..256 is an ember::Error naming it and its position.
  std::string decode(const std::vector<int64_t>& ids) const;
  // Same, with the end-of-text id left out of the text.
  std::string decode_skipping_end_of_text(const std::vector<int64_t>& ids) const;

 private:
  std::string decode_impl(const std::vector<int64_t>& ids, bool keep_end_of_text) const;
};

}  // namespace ember::data
