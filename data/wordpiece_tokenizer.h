// BERT's uncased WordPiece tokenizer, giving the same ids as Hugging Face's pure-Python
// BertTokenizer (transformers 5: BertTokenizerLegacy) with do_lower_case=True, character for
// character; tests/golden/make_tokenizer_golden.py records that reference.
//
// Pipeline for one piece of text:
//  1. UTF-8 bytes are decoded; each invalid subpart becomes U+FFFD, which step 3 then drops,
//     exactly what Hugging Face does with text decoded by bytes.decode("utf-8", "replace").
//     (File readers in data/text_io.h decode stray Latin-1 bytes before text gets here.)
//  2. Exact occurrences of [PAD] [UNK] [CLS] [SEP] [MASK] are kept whole as special tokens.
//  3. Clean: drop NUL, U+FFFD and control/format/unassigned characters; whitespace -> space.
//  4. Put spaces around CJK ideographs; split on whitespace.
//  5. Per word: lowercase (Python str.lower(), final sigma included), NFD, drop nonspacing
//     marks (accents), split off every punctuation character.
//  6. WordPiece: greedy longest match first, "##" on continuation pieces; a word longer than
//     100 code points, or one with a piece not in the vocabulary, becomes [UNK].
// Hugging Face's NFC step is left out: NFD follows it, and NFD(lower(NFC(x))) == NFD(lower(x))
// for every input the golden test tries (all code points, alone and between letters).
//
// Versions: transformers 4.x lowercased the text one character at a time, so it writes a
// capital sigma at the end of a word as "σ"; 5.x (and Python's str.lower) write "ς". We follow
// 5.x. It also differs from 4.x, which leaves a text untruncated when max_length leaves no
// room for it, where 5.x (and we) keep just [CLS] [SEP].
// Where Hugging Face returns something odd we raise ember::Error instead: an id outside the
// vocabulary (HF: "[UNK]"), and a max_length below the number of special tokens (HF: a result
// longer than max_length).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ember::data {

struct Encoding {
  std::vector<int64_t> input_ids;
  std::vector<int64_t> token_type_ids;  // 0 for the first text (with [CLS] and its [SEP]), 1 for the second
  std::vector<int64_t> attention_mask;  // 1 for tokens, 0 for padding
  int64_t size() const { return int64_t(input_ids.size()); }
};

struct EncodeOptions {
  bool add_special_tokens = true;  // [CLS] a [SEP] (b [SEP])
  bool truncation = true;          // cut to max_length: the longer text first, like Hugging Face
  int64_t max_length = 512;
  bool pad_to_max_length = false;  // append [PAD] (mask 0, type 0) up to max_length
};

class WordPieceTokenizer {
 public:
  // One token per line, id = line index. Plain or gzip. Throws ember::Error when the file is
  // missing, empty, not UTF-8, or lacks one of [PAD] [UNK] [CLS] [SEP] [MASK].
  static WordPieceTokenizer from_file(const std::string& vocab_path);
  // From the vocabulary in id order (`source` names it in error messages).
  explicit WordPieceTokenizer(std::vector<std::string> vocab, const std::string& source = "vocabulary");

  // Word pieces of `text` (UTF-8), without [CLS]/[SEP].
  std::vector<std::string> tokenize(std::string_view text) const;
  Encoding encode(std::string_view text, const EncodeOptions& options = {}) const;
  Encoding encode_pair(std::string_view a, std::string_view b, const EncodeOptions& options = {}) const;

  // Unknown tokens map to [UNK]; ids out of range raise ember::Error.
  std::vector<int64_t> convert_tokens_to_ids(const std::vector<std::string>& tokens) const;
  std::vector<std::string> convert_ids_to_tokens(const std::vector<int64_t>& ids,
                                                 bool skip_special_tokens = false) const;
  int64_t token_to_id(std::string_view token) const;  // [UNK]'s id when absent
  const std::string& id_to_token(int64_t id) const;
  // Tokens joined with spaces, "##" pieces glued to the previous one, and Hugging Face's
  // clean-up of spaces before punctuation and contractions (" ." -> ".", " n't" -> "n't", ...).
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = false,
                     bool clean_up_tokenization_spaces = true) const;

  // Number of ids (lines of vocab.txt): the embedding table size.
  int64_t vocab_size() const { return int64_t(id_to_token_.size()); }
  int64_t pad_id() const { return pad_id_; }
  int64_t unk_id() const { return unk_id_; }
  int64_t cls_id() const { return cls_id_; }
  int64_t sep_id() const { return sep_id_; }
  int64_t mask_id() const { return mask_id_; }
  const std::vector<int64_t>& special_ids() const { return special_ids_; }

  // Longest word, in code points, that WordPiece splits; longer words become [UNK].
  static constexpr size_t kMaxWordChars = 100;

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  using Vocab = std::unordered_map<std::string, int64_t, StringHash, std::equal_to<>>;

  void append_text_ids(std::u32string_view segment, std::vector<int64_t>& ids,
                       std::vector<std::string>* tokens) const;
  void append_wordpieces(std::u32string_view word, std::vector<int64_t>& ids,
                         std::vector<std::string>* tokens) const;
  void tokenize_into(std::string_view text, std::vector<int64_t>& ids, std::vector<std::string>* tokens) const;
  std::vector<int64_t> text_ids(std::string_view text) const;
  Encoding build(std::vector<int64_t> a, std::vector<int64_t>* b, const EncodeOptions& options) const;
  void check_id(int64_t id, const char* op) const;

  std::vector<std::string> id_to_token_;
  Vocab token_to_id_;
  int64_t pad_id_ = 0, unk_id_ = 0, cls_id_ = 0, sep_id_ = 0, mask_id_ = 0;
  std::vector<int64_t> special_ids_;
};

// The name Hugging Face users know.
using BertTokenizer = WordPieceTokenizer;

}  // namespace ember::data
