#include "data/wordpiece_tokenizer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>

#include "core/error.h"
#include "data/text_io.h"
#include "data/unicode.h"

namespace ember::data {

namespace {

using unicode::CharClass;

constexpr std::array<std::string_view, 5> kSpecialTokens = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};

// Length of the special token spelled at text[pos], or 0.
size_t special_token_at(std::string_view text, size_t pos) {
  for (std::string_view s : kSpecialTokens)
    if (text.compare(pos, s.size(), s) == 0) return s.size();
  return 0;
}

bool is_word_separator(char32_t c) { return c == U' ' || unicode::char_class(c) == CharClass::Split; }

// Steps 3 and 4 of the pipeline: cleaned text with CJK ideographs spaced out, split into words.
std::vector<std::u32string> clean_and_split(std::u32string_view text) {
  std::u32string cleaned;
  cleaned.reserve(text.size());
  for (char32_t c : text) {
    switch (unicode::char_class(c)) {
      case CharClass::Drop:
        break;
      case CharClass::Space:
        cleaned.push_back(U' ');
        break;
      default:
        if (unicode::is_cjk_ideograph(c)) {
          cleaned.push_back(U' ');
          cleaned.push_back(c);
          cleaned.push_back(U' ');
        } else {
          cleaned.push_back(c);
        }
    }
  }
  std::vector<std::u32string> words;
  size_t i = 0;
  while (i < cleaned.size()) {
    while (i < cleaned.size() && is_word_separator(cleaned[i])) ++i;
    size_t start = i;
    while (i < cleaned.size() && !is_word_separator(cleaned[i])) ++i;
    if (i > start) words.emplace_back(cleaned, start, i - start);
  }
  return words;
}

// Step 5: lowercase, strip accents, split off punctuation.
void append_basic_tokens(const std::u32string& word, std::vector<std::u32string>& out) {
  std::u32string stripped;
  for (char32_t c : unicode::nfd(unicode::to_lower(word)))
    if (unicode::char_class(c) != CharClass::Mark) stripped.push_back(c);
  std::u32string current;
  for (char32_t c : stripped) {
    if (unicode::char_class(c) == CharClass::Punct) {
      if (!current.empty()) out.push_back(std::move(current));
      current.clear();
      out.emplace_back(1, c);
    } else {
      current.push_back(c);
    }
  }
  if (!current.empty()) out.push_back(std::move(current));
}

// Python's str.replace: every non-overlapping occurrence, left to right.
std::string replace_all(std::string s, std::string_view from, std::string_view to) {
  std::string out;
  size_t pos = 0, hit;
  while ((hit = s.find(from, pos)) != std::string::npos) {
    out.append(s, pos, hit - pos);
    out.append(to);
    pos = hit + from.size();
  }
  out.append(s, pos, std::string::npos);
  return out;
}

}  // namespace

WordPieceTokenizer WordPieceTokenizer::from_file(const std::string& vocab_path) {
  std::vector<std::string> vocab = read_lines(vocab_path, false, InvalidUtf8Policy::Error);
  EMBER_CHECK(!vocab.empty(), "vocab: '", vocab_path, "' is empty");
  return WordPieceTokenizer(std::move(vocab), "'" + vocab_path + "'");
}

WordPieceTokenizer::WordPieceTokenizer(std::vector<std::string> vocab, const std::string& source)
    : id_to_token_(std::move(vocab)) {
  EMBER_CHECK(!id_to_token_.empty(), "vocab: ", source, " is empty");
  token_to_id_.reserve(id_to_token_.size());
  // A repeated token keeps its last id, as Hugging Face's dict-based loader does.
  for (size_t i = 0; i < id_to_token_.size(); ++i) token_to_id_[id_to_token_[i]] = int64_t(i);
  std::string missing;
  auto find = [&](std::string_view name) -> int64_t {
    auto it = token_to_id_.find(name);
    if (it != token_to_id_.end()) return it->second;
    missing += (missing.empty() ? "" : ", ") + std::string(name);
    return -1;
  };
  pad_id_ = find("[PAD]");
  unk_id_ = find("[UNK]");
  cls_id_ = find("[CLS]");
  sep_id_ = find("[SEP]");
  mask_id_ = find("[MASK]");
  EMBER_CHECK(missing.empty(), "vocab: ", source, " lacks the special token(s) ", missing,
              " (a BERT vocab.txt has [PAD], [UNK], [CLS], [SEP] and [MASK])");
  special_ids_ = {pad_id_, unk_id_, cls_id_, sep_id_, mask_id_};
}

void WordPieceTokenizer::append_wordpieces(std::u32string_view word, std::vector<int64_t>& ids,
                                           std::vector<std::string>* tokens) const {
  auto emit = [&](int64_t id, std::string_view text) {
    ids.push_back(id);
    if (tokens) tokens->emplace_back(text);
  };
  if (word.size() > kMaxWordChars) return emit(unk_id_, id_to_token_[size_t(unk_id_)]);

  // Candidate pieces are substrings of the word's UTF-8: utf8[offset[start] .. offset[end]).
  std::string utf8;
  std::vector<size_t> offset(word.size() + 1);
  for (size_t i = 0; i < word.size(); ++i) {
    offset[i] = utf8.size();
    unicode::append_utf8(word[i], utf8);
  }
  offset[word.size()] = utf8.size();

  const size_t first_new = ids.size();
  std::string candidate;
  for (size_t start = 0; start < word.size();) {
    size_t end = word.size();
    Vocab::const_iterator hit = token_to_id_.end();
    for (; end > start; --end) {
      candidate.assign(start > 0 ? "##" : "");
      candidate.append(utf8, offset[start], offset[end] - offset[start]);
      hit = token_to_id_.find(std::string_view(candidate));
      if (hit != token_to_id_.end()) break;
    }
    if (hit == token_to_id_.end()) {  // some piece has no match: the whole word is unknown
      const size_t added = ids.size() - first_new;
      ids.resize(first_new);
      if (tokens) tokens->resize(tokens->size() - added);
      return emit(unk_id_, id_to_token_[size_t(unk_id_)]);
    }
    emit(hit->second, hit->first);
    start = end;
  }
}

void WordPieceTokenizer::append_text_ids(std::u32string_view segment, std::vector<int64_t>& ids,
                                         std::vector<std::string>* tokens) const {
  std::vector<std::u32string> basic;
  for (const std::u32string& word : clean_and_split(segment)) append_basic_tokens(word, basic);
  for (const std::u32string& piece : basic) append_wordpieces(piece, ids, tokens);
}

void WordPieceTokenizer::tokenize_into(std::string_view text, std::vector<int64_t>& ids,
                                       std::vector<std::string>* tokens) const {
  // Special tokens are ASCII, so they can be found in the raw bytes: no UTF-8 sequence, valid
  // or broken, contains a '[' byte.
  size_t segment_start = 0;
  for (size_t pos = text.find('['); pos != std::string_view::npos; pos = text.find('[', pos)) {
    const size_t len = special_token_at(text, pos);
    if (len == 0) {
      ++pos;
      continue;
    }
    append_text_ids(unicode::decode_utf8(text.substr(segment_start, pos - segment_start)), ids, tokens);
    const std::string_view special = text.substr(pos, len);
    ids.push_back(token_to_id_.find(special)->second);
    if (tokens) tokens->emplace_back(special);
    pos += len;
    segment_start = pos;
  }
  append_text_ids(unicode::decode_utf8(text.substr(segment_start)), ids, tokens);
}

std::vector<std::string> WordPieceTokenizer::tokenize(std::string_view text) const {
  std::vector<int64_t> ids;
  std::vector<std::string> tokens;
  tokenize_into(text, ids, &tokens);
  return tokens;
}

std::vector<int64_t> WordPieceTokenizer::text_ids(std::string_view text) const {
  std::vector<int64_t> ids;
  tokenize_into(text, ids, nullptr);
  return ids;
}

Encoding WordPieceTokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  return build(text_ids(text), nullptr, options);
}

Encoding WordPieceTokenizer::encode_pair(std::string_view a, std::string_view b,
                                         const EncodeOptions& options) const {
  std::vector<int64_t> second = text_ids(b);
  return build(text_ids(a), &second, options);
}

Encoding WordPieceTokenizer::build(std::vector<int64_t> a, std::vector<int64_t>* b,
                                   const EncodeOptions& options) const {
  const int64_t num_special = options.add_special_tokens ? (b ? 3 : 2) : 0;
  EMBER_CHECK(options.max_length > 0 || !(options.truncation || options.pad_to_max_length),
              "encode: max_length must be positive, got ", options.max_length);
  const int64_t la = int64_t(a.size()), lb = b ? int64_t(b->size()) : 0;
  const int64_t total = la + lb + num_special;
  if (options.truncation && total > options.max_length) {
    EMBER_CHECK(options.max_length >= num_special, "encode: max_length ", options.max_length,
                " leaves no room for the ", num_special, " special tokens");
    const int64_t remove = total - options.max_length;
    if (!b) {
      a.resize(size_t(la - remove));
    } else {
      // Longest first: trim the longer text down to the shorter, then both alternately, the
      // second text first on ties (Hugging Face's closed form of the same loop).
      const int64_t first = std::min(std::abs(lb - la), remove);
      const int64_t second = remove - first;
      const int64_t from_a = la > lb ? first + second / 2 : second / 2;
      const int64_t from_b = remove - from_a;
      a.resize(size_t(la - from_a));
      b->resize(size_t(lb - from_b));
    }
  }

  Encoding e;
  const size_t n = a.size() + (b ? b->size() : 0) + size_t(num_special);
  e.input_ids.reserve(n);
  if (options.add_special_tokens) e.input_ids.push_back(cls_id_);
  e.input_ids.insert(e.input_ids.end(), a.begin(), a.end());
  if (options.add_special_tokens) e.input_ids.push_back(sep_id_);
  const size_t first_len = e.input_ids.size();
  if (b) {
    e.input_ids.insert(e.input_ids.end(), b->begin(), b->end());
    if (options.add_special_tokens) e.input_ids.push_back(sep_id_);
  }
  e.token_type_ids.assign(e.input_ids.size(), 0);
  if (options.add_special_tokens)
    std::fill(e.token_type_ids.begin() + std::ptrdiff_t(first_len), e.token_type_ids.end(), 1);
  e.attention_mask.assign(e.input_ids.size(), 1);
  if (options.pad_to_max_length && e.size() < options.max_length) {
    e.input_ids.resize(size_t(options.max_length), pad_id_);
    e.token_type_ids.resize(size_t(options.max_length), 0);
    e.attention_mask.resize(size_t(options.max_length), 0);
  }
  return e;
}

void WordPieceTokenizer::check_id(int64_t id, const char* op) const {
  EMBER_CHECK(id >= 0 && id < vocab_size(), op, ": token id ", id, " is out of range for a vocabulary of ",
              vocab_size());
}

std::vector<int64_t> WordPieceTokenizer::convert_tokens_to_ids(const std::vector<std::string>& tokens) const {
  std::vector<int64_t> ids;
  ids.reserve(tokens.size());
  for (const std::string& t : tokens) ids.push_back(token_to_id(t));
  return ids;
}

std::vector<std::string> WordPieceTokenizer::convert_ids_to_tokens(const std::vector<int64_t>& ids,
                                                                   bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int64_t id : ids) {
    check_id(id, "convert_ids_to_tokens");
    if (skip_special_tokens && std::find(special_ids_.begin(), special_ids_.end(), id) != special_ids_.end())
      continue;
    tokens.push_back(id_to_token_[size_t(id)]);
  }
  return tokens;
}

int64_t WordPieceTokenizer::token_to_id(std::string_view token) const {
  auto it = token_to_id_.find(token);
  return it == token_to_id_.end() ? unk_id_ : it->second;
}

const std::string& WordPieceTokenizer::id_to_token(int64_t id) const {
  check_id(id, "id_to_token");
  return id_to_token_[size_t(id)];
}

std::string WordPieceTokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens,
                                       bool clean_up_tokenization_spaces) const {
  for (int64_t id : ids) check_id(id, "decode");
  const std::vector<std::string> tokens = convert_ids_to_tokens(ids, skip_special_tokens);
  std::string text;
  for (size_t i = 0; i < tokens.size(); ++i) text += (i ? " " : "") + tokens[i];
  text = replace_all(std::move(text), " ##", "");
  const size_t a = text.find_first_not_of(' ');
  text = a == std::string::npos ? std::string() : text.substr(a, text.find_last_not_of(' ') - a + 1);
  if (!clean_up_tokenization_spaces) return text;
  static constexpr std::pair<std::string_view, std::string_view> kCleanUps[] = {
      {" .", "."},   {" ?", "?"},     {" !", "!"},     {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kCleanUps) text = replace_all(std::move(text), from, to);
  return text;
}

}  // namespace ember::data
