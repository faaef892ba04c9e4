// The WordPiece tokenizer against Hugging Face's Python BertTokenizer: every record of
// tests/golden/tokenizer_golden.jsonl.gz (made by make_tokenizer_golden.py) must give the same
// ids, token types, mask, tokens and decoded text. Plus vocab loading errors and the Unicode
// helpers underneath.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/text_io.h"
#include "data/tsv_dataset.h"
#include "data/unicode.h"
#include "data/wordpiece_tokenizer.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace ember::data;
using nlohmann::json;

namespace {

std::string source_path(const std::string& rel) { return std::string(EMBER_SOURCE_DIR) + "/" + rel; }

const WordPieceTokenizer& bert() {
  static const WordPieceTokenizer tok =
      WordPieceTokenizer::from_file(source_path("datasets/vocab/bert-base-uncased-vocab.txt.gz"));
  return tok;
}

const std::vector<json>& golden() {
  static const std::vector<json> records = [] {
    std::vector<json> out;
    for (const std::string& line :
         read_lines(source_path("tests/golden/tokenizer_golden.jsonl.gz"), true, InvalidUtf8Policy::Error))
      out.push_back(json::parse(line));
    return out;
  }();
  return records;
}

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(char(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

// The text of a record: UTF-8 string, raw bytes in hex, or a code point sweep.
std::string text_of(const json& r, const char* key) {
  const std::string k = key;
  if (r.contains(k)) return r[k].get<std::string>();
  if (r.contains(k + "_hex")) return from_hex(r[k + "_hex"].get<std::string>());
  return {};
}

std::string sweep_text(const json& r) {
  const auto range = r["codepoints"].get<std::vector<int64_t>>();
  const std::string sep = r["sep"], pre = r["wrap"][0], post = r["wrap"][1];
  std::string out;
  bool first = true;
  for (int64_t c = range[0]; c < range[1]; ++c) {
    if (c >= 0xD800 && c <= 0xDFFF) continue;
    if (!first) out += sep;
    first = false;
    out += pre;
    unicode::append_utf8(char32_t(c), out);
    out += post;
  }
  return out;
}

std::string show_tokens(const std::vector<int64_t>& ids) {
  std::string out;
  for (int64_t id : ids) out += bert().id_to_token(id) + " ";
  return out;
}

std::string show(const std::vector<int64_t>& v) { return ember::shape_str(v); }

}  // namespace

TEST(TokenizerGolden, RecordsAreComplete) {
  const auto& records = golden();
  ASSERT_GT(records.size(), 1500u);
  ASSERT_TRUE(records[0].contains("meta"));
  // The sweep covers every code point, so the tables must be the golden file's Unicode version.
  EXPECT_EQ(records[0]["meta"]["unicode"].get<std::string>(), unicode::unicode_version());
  int sst2 = 0, sweeps = 0;
  for (const json& r : records) {
    if (!r.contains("name")) continue;
    sst2 += r["name"].get<std::string>().rfind("sst2_dev_", 0) == 0;
    sweeps += r.contains("codepoints");
  }
  EXPECT_EQ(sst2, 872);
  EXPECT_EQ(sweeps, 2 * 272);  // 0x110000 / 4096 chunks, two spellings each
}

TEST(TokenizerGolden, SameIdsAsHuggingFace) {
  int checked = 0, failures = 0;
  for (const json& r : golden()) {
    if (!r.contains("name") || r.contains("codepoints")) continue;
    const std::string name = r["name"];
    const json& o = r["options"];
    EncodeOptions opt;
    opt.add_special_tokens = o["add_special_tokens"];
    opt.truncation = o["truncation"];
    opt.max_length = o["max_length"];
    opt.pad_to_max_length = o["padding"];
    const std::string a = text_of(r, "text");
    const bool pair = r.contains("text_b") || r.contains("text_b_hex");
    const Encoding e = pair ? bert().encode_pair(a, text_of(r, "text_b"), opt) : bert().encode(a, opt);
    const auto want_ids = r["input_ids"].get<std::vector<int64_t>>();
    const bool ok = e.input_ids == want_ids &&
                    e.token_type_ids == r["token_type_ids"].get<std::vector<int64_t>>() &&
                    e.attention_mask == r["attention_mask"].get<std::vector<int64_t>>();
    EXPECT_TRUE(ok) << name << "\n  text: " << a << "\n  ember: " << show(e.input_ids) << "\n         "
                    << show_tokens(e.input_ids) << "\n  HF:    " << show(want_ids) << "\n         "
                    << show_tokens(want_ids) << "\n  types " << show(e.token_type_ids) << " mask "
                    << show(e.attention_mask);
    if (r.contains("tokens")) {
      EXPECT_EQ(bert().tokenize(a), r["tokens"].get<std::vector<std::string>>()) << name;
    }
    EXPECT_EQ(bert().decode(e.input_ids), r["decoded"].get<std::string>()) << name;
    EXPECT_EQ(bert().decode(e.input_ids, true), r["decoded_skip"].get<std::string>()) << name;
    failures += !ok;
    ++checked;
    if (failures > 20) FAIL() << "stopping after 20 mismatching records";
  }
  EXPECT_GT(checked, 1300);
}

TEST(TokenizerGolden, EveryCodePoint) {
  EncodeOptions raw;
  raw.add_special_tokens = false;
  raw.truncation = false;
  int failures = 0;
  for (const json& r : golden()) {
    if (!r.contains("codepoints")) continue;
    const auto want = r["input_ids"].get<std::vector<int64_t>>();
    const auto got = bert().encode(sweep_text(r), raw).input_ids;
    if (got == want) continue;
    size_t i = 0;
    while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
    ADD_FAILURE() << r["name"].get<std::string>() << ": first difference at id " << i << " (ember "
                  << (i < got.size() ? bert().id_to_token(got[i]) : "<end>") << ", HF "
                  << (i < want.size() ? bert().id_to_token(want[i]) : "<end>") << "), lengths " << got.size()
                  << " vs " << want.size();
    if (++failures > 10) FAIL() << "stopping after 10 mismatching sweeps";
  }
}

TEST(TokenizerGolden, Sst2DevTextsMatchTheReader) {
  // The golden texts were read by Python; the TSV reader must produce the same strings.
  const LabeledTexts dev = read_labeled_tsv(source_path("datasets/sst2/dev.tsv.gz"));
  int64_t i = 0;
  for (const json& r : golden()) {
    if (!r.contains("name") || r["name"].get<std::string>().rfind("sst2_dev_", 0) != 0) continue;
    ASSERT_LT(i, dev.size());
    EXPECT_EQ(dev.texts[size_t(i)], r["text"].get<std::string>()) << i;
    ++i;
  }
  EXPECT_EQ(i, dev.size());
}

// ---- API behaviour beyond the golden records

TEST(Tokenizer, SpecialIdsAndVocab) {
  const auto& t = bert();
  EXPECT_EQ(t.vocab_size(), 30522);
  EXPECT_EQ(t.pad_id(), 0);
  EXPECT_EQ(t.unk_id(), 100);
  EXPECT_EQ(t.cls_id(), 101);
  EXPECT_EQ(t.sep_id(), 102);
  EXPECT_EQ(t.mask_id(), 103);
  EXPECT_EQ(t.token_to_id("hello"), 7592);
  EXPECT_EQ(t.token_to_id("definitely-not-a-token"), 100);
  EXPECT_EQ(t.id_to_token(7592), "hello");
  EXPECT_EQ(t.convert_tokens_to_ids({"[CLS]", "hello", "zzzzqqq"}), (std::vector<int64_t>{101, 7592, 100}));
  EXPECT_EQ(t.convert_ids_to_tokens({101, 7592, 102}, true), std::vector<std::string>{"hello"});
  EXPECT_EQ(t.tokenize("unaffable tokenization"),
            (std::vector<std::string>{"una", "##ffa", "##ble", "token", "##ization"}));
}

TEST(Tokenizer, BadIdsAndLengthsRaise) {
  const auto& t = bert();
  EXPECT_EMBER_ERROR(t.decode({101, 30522}), "decode", "30522", "30522");
  EXPECT_EMBER_ERROR(t.id_to_token(-1), "id_to_token", "-1");
  EXPECT_EMBER_ERROR(t.convert_ids_to_tokens({5, 99999}), "convert_ids_to_tokens", "99999");
  EncodeOptions tiny;
  tiny.max_length = 1;
  EXPECT_EMBER_ERROR(t.encode("some words", tiny), "max_length 1", "2 special tokens");
  tiny.max_length = 2;
  EXPECT_EMBER_ERROR(t.encode_pair("a", "b", tiny), "max_length 2", "3 special tokens");
  tiny.max_length = 0;
  EXPECT_EMBER_ERROR(t.encode("a", tiny), "max_length must be positive");
  // Short enough input needs no room: no error.
  tiny.max_length = 1;
  tiny.add_special_tokens = false;
  EXPECT_EQ(t.encode("hello", tiny).input_ids, std::vector<int64_t>{7592});
}

TEST(Tokenizer, InvalidUtf8NeverCrashes) {
  // Every single byte and every pair of bytes, glued to words: ids must come out, and an
  // invalid byte must never swallow the valid text after it.
  const auto& t = bert();
  for (int b = 0; b < 256; ++b) {
    const std::string s = "hello" + std::string(1, char(b)) + " world";
    const auto ids = t.encode(s).input_ids;
    ASSERT_GE(ids.size(), 3u);
    EXPECT_EQ(ids[ids.size() - 2], 2088) << b;  // "world"
  }
  for (int b1 = 0x80; b1 < 0x100; ++b1)
    for (int b2 = 0; b2 < 0x100; b2 += 7) {
      const std::string s = std::string(1, char(b1)) + char(b2) + " x";
      ASSERT_FALSE(t.tokenize(s).empty()) << b1 << " " << b2;
      EXPECT_EQ(t.tokenize(s).back(), "x") << b1 << " " << b2;
    }
}

namespace {
class VocabFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ember_vocab_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& content, bool gz = false) {
    const std::string p = (dir_ / name).string();
    write_text_file(p, content, gz);
    return p;
  }
  fs::path dir_;
};
}  // namespace

TEST_F(VocabFileTest, MissingEmptyOrIncompleteVocab) {
  EXPECT_EMBER_ERROR(WordPieceTokenizer::from_file((dir_ / "vocab.txt").string()), "vocab.txt", "file not found");
  EXPECT_EMBER_ERROR(WordPieceTokenizer::from_file(write("empty.txt", "")), "empty.txt", "is empty");
  EXPECT_EMBER_ERROR(WordPieceTokenizer::from_file(write("empty.gz", "", true)), "empty.gz", "is empty");
  EXPECT_EMBER_ERROR(WordPieceTokenizer::from_file(write("partial.txt", "[PAD]\n[UNK]\n[CLS]\nhello\n")),
                     "partial.txt", "[SEP], [MASK]");
  EXPECT_EMBER_ERROR(WordPieceTokenizer::from_file(write("latin1.txt", "[PAD]\n[UNK]\ncaf\xe9\n")), "latin1.txt:3",
                     "not valid UTF-8");
  EXPECT_EMBER_ERROR(WordPieceTokenizer(std::vector<std::string>{}), "empty");
}

TEST_F(VocabFileTest, PlainGzipAndCrlfVocabsAgree) {
  const std::string vocab = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n##s\n,\n";
  std::string crlf;
  for (char c : vocab) crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
  for (const std::string& path : {write("v.txt", vocab), write("v.txt.gz", vocab, true), write("crlf.txt", crlf)}) {
    const auto t = WordPieceTokenizer::from_file(path);
    EXPECT_EQ(t.vocab_size(), 9) << path;
    EXPECT_EQ(t.encode("Hello, worlds!").input_ids, (std::vector<int64_t>{2, 5, 8, 6, 7, 1, 3})) << path;
  }
  const auto t = WordPieceTokenizer::from_file(write("v2.txt", vocab));
  Encoding e = t.encode_pair("hello hello hello", "world", {.truncation = true, .max_length = 6,
                                                             .pad_to_max_length = false});
  EXPECT_EQ(e.input_ids, (std::vector<int64_t>{2, 5, 5, 3, 6, 3}));
  EXPECT_EQ(e.token_type_ids, (std::vector<int64_t>{0, 0, 0, 0, 1, 1}));
}

// ---- Unicode helpers

TEST(Unicode, Utf8DecodingModes) {
  using unicode::InvalidUtf8;
  EXPECT_EQ(unicode::decode_utf8("a\xc3\xa9\xe2\x82\xac\xf0\x9f\xa4\x97"), (std::u32string{U'a', 0xE9, 0x20AC, 0x1F917}));
  // Maximal subparts: E2 82 is one broken sequence, the 'z' after it survives.
  EXPECT_EQ(unicode::decode_utf8("\xe2\x82z"), (std::u32string{0xFFFD, U'z'}));
  EXPECT_EQ(unicode::decode_utf8("\xe2\x82z", InvalidUtf8::Latin1), (std::u32string{0xE2, 0x82, U'z'}));
  // Surrogates, overlongs and > U+10FFFF are invalid, one replacement per bad byte here.
  EXPECT_EQ(unicode::decode_utf8("\xed\xa0\x80"), (std::u32string{0xFFFD, 0xFFFD, 0xFFFD}));
  EXPECT_EQ(unicode::decode_utf8("\xc0\xaf"), (std::u32string{0xFFFD, 0xFFFD}));
  EXPECT_EQ(unicode::decode_utf8("\xf4\x90\x80\x80"), (std::u32string(4, 0xFFFD)));
  EXPECT_TRUE(unicode::is_valid_utf8("plain \xef\xbf\xbd ok"));
  EXPECT_FALSE(unicode::is_valid_utf8("x\xff"));
  EXPECT_FALSE(unicode::is_valid_utf8("\xe2\x82"));
  for (char32_t c : {char32_t(0x7F), char32_t(0x80), char32_t(0x7FF), char32_t(0x800), char32_t(0xFFFF),
                     char32_t(0x10000), char32_t(0x10FFFF)})
    EXPECT_EQ(unicode::decode_utf8(unicode::encode_utf8(std::u32string(1, c))), std::u32string(1, c));
}

TEST(Unicode, LowerAndNfd) {
  // U+0130 lowercases to two code points; it is cased, so a sigma after it is final.
  EXPECT_EQ(unicode::to_lower(U"ÀB\u0130\u03a3"), (std::u32string{0xE0, U'b', U'i', 0x307, 0x3C2}));
  EXPECT_EQ(unicode::to_lower(U"\u03a3"), (std::u32string{0x3C3}));  // nothing cased before it
  EXPECT_EQ(unicode::to_lower(U"Α\u03a3"), (std::u32string{0x3B1, 0x3C2}));        // final sigma
  EXPECT_EQ(unicode::to_lower(U"Α\u03a3Α"), (std::u32string{0x3B1, 0x3C3, 0x3B1}));  // medial
  EXPECT_EQ(unicode::nfd(U"\u00e9"), (std::u32string{U'e', 0x301}));
  EXPECT_EQ(unicode::nfd(U"\u1e09"), (std::u32string{U'c', 0x327, 0x301}));  // recursive decomposition
  EXPECT_EQ(unicode::nfd(U"\uac01"), (std::u32string{0x1100, 0x1161, 0x11A8}));  // Hangul LVT
  EXPECT_EQ(unicode::nfd(U"a\u0301\u0327"), (std::u32string{U'a', 0x327, 0x301}));  // reordered by ccc
  EXPECT_EQ(unicode::char_class(0x2028), unicode::CharClass::Split);
  EXPECT_EQ(unicode::char_class(0x00AD), unicode::CharClass::Drop);
  EXPECT_EQ(unicode::char_class(U'$'), unicode::CharClass::Punct);
  EXPECT_EQ(unicode::char_class(0x0301), unicode::CharClass::Mark);
  EXPECT_EQ(unicode::char_class(0x3000), unicode::CharClass::Space);
}
