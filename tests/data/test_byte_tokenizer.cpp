// The byte-level tokenizer: ids are the UTF-8 bytes, 256 ends a document; real corpus lines
// (accents, dashes, Chinese, Latin-1 books) come back exactly, and any bytes decode.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/byte_tokenizer.h"
#include "data/text_io.h"
#include "data/unicode.h"
#include "test_util.h"

using namespace ember::data;

namespace {

std::string corpus_file(const std::string& name) { return std::string(EMBER_SOURCE_DIR) + "/datasets/corpus/" + name; }

bool has_non_ascii(const std::string& s) {
  for (const char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return true;
  return false;
}

TEST(ByteTokenizer, IdsAreTheUtf8Bytes) {
  const ByteTokenizer tok;
  EXPECT_EQ(tok.vocab_size(), 257);
  EXPECT_EQ(tok.end_of_text_id(), 256);
  EXPECT_EQ(tok.encode("Ab\n"), (std::vector<int64_t>{65, 98, 10}));
  // "é" is C3 A9 and "–" (en dash) E2 80 93 in UTF-8.
  EXPECT_EQ(tok.encode("\xC3\xA9\xE2\x80\x93"), (std::vector<int64_t>{0xC3, 0xA9, 0xE2, 0x80, 0x93}));
  EXPECT_TRUE(tok.encode("").empty());
  EXPECT_EQ(tok.encode(std::string("a\0b", 3)), (std::vector<int64_t>{97, 0, 98}));
}

TEST(ByteTokenizer, RealCorpusLinesRoundTripIncludingNonAscii) {
  const ByteTokenizer tok;
  const std::vector<std::string> lines = read_lines(corpus_file("wikitext2_raw_test.txt.gz"));
  int64_t non_ascii = 0;
  for (const std::string& line : lines) {
    const std::vector<int64_t> ids = tok.encode(line);
    ASSERT_EQ(ids.size(), line.size());
    for (const int64_t id : ids) ASSERT_TRUE(id >= 0 && id < 256) << id;
    ASSERT_EQ(tok.decode(ids), line);
    non_ascii += has_non_ascii(line);
  }
  EXPECT_GT(non_ascii, 100);  // dashes, accents and Chinese names, as the file has them

  // One line with Chinese characters: 3 bytes (3 ids) for each of them.
  bool found = false;
  for (const std::string& line : lines) {
    if (line.find("\xE6\x9D\x9C\xE7\x94\xAB") == std::string::npos) continue;  // 杜甫 (Du Fu)
    found = true;
    EXPECT_GT(tok.encode(line).size(), ember::data::unicode::decode_utf8(line).size());
    EXPECT_EQ(tok.decode(tok.encode(line)), line);
  }
  EXPECT_TRUE(found);

  // A Gutenberg book with Latin-1 bytes: the reader makes them UTF-8, and they round-trip so.
  const std::vector<std::string> book = read_lines(corpus_file("gutenberg/chesterton-ball.txt.gz"));
  int64_t cafe = 0;
  for (const std::string& line : book) {
    ASSERT_EQ(tok.decode(tok.encode(line)), line);
    cafe += line.find("caf\xC3\xA9") != std::string::npos;
  }
  EXPECT_GE(cafe, 1);
}

TEST(ByteTokenizer, EndOfTextSeparatesDocuments) {
  const ByteTokenizer tok;
  const std::vector<int64_t> ids = tok.encode_documents({"ab", "", "\xC3\xA9"});
  EXPECT_EQ(ids, (std::vector<int64_t>{97, 98, 256, 256, 0xC3, 0xA9, 256}));
  EXPECT_EQ(tok.decode(ids), "ab<|endoftext|><|endoftext|>\xC3\xA9<|endoftext|>");
  EXPECT_EQ(tok.decode_skipping_end_of_text(ids), "ab\xC3\xA9");
  // A character cut by an end-of-text id is broken on both sides, not glued across it.
  EXPECT_EQ(tok.decode({0xC3, 256, 0xA9}), "\xEF\xBF\xBD<|endoftext|>\xEF\xBF\xBD");
  EXPECT_EQ(tok.decode_skipping_end_of_text({0xC3, 256, 0xA9}), "\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(ByteTokenizer, InvalidBytesBecomeReplacementCharacters) {
  const ByteTokenizer tok;
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(tok.decode({0xE9}), fffd);                      // a Latin-1 byte alone
  EXPECT_EQ(tok.decode({0x63, 0x61, 0x66, 0xE9}), "caf" + fffd);
  EXPECT_EQ(tok.decode({0xE2, 0x80, 0x41}), fffd + "A");    // a cut 3-byte sequence is one U+FFFD
  EXPECT_EQ(tok.decode({0x80, 0x80}), fffd + fffd);         // lone continuation bytes: one each
  EXPECT_EQ(tok.decode({0xED, 0xA0, 0x80}), fffd + fffd + fffd);  // a surrogate is not UTF-8
}

TEST(ByteTokenizer, DecodingArbitraryBytesNeverThrowsAndGivesValidUtf8) {
  const ByteTokenizer tok;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> byte(0, 255), length(0, 64);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<int64_t> ids(size_t(length(rng)));
    for (auto& id : ids) id = byte(rng) == 0 ? 256 : byte(rng);
    std::string text;
    ASSERT_NO_THROW(text = tok.decode(ids));
    ASSERT_TRUE(ember::data::unicode::is_valid_utf8(text));
    // Valid input comes back unchanged, so decoding the text's own bytes is the identity.
    ASSERT_EQ(tok.decode(tok.encode(text)), text);
  }
}

TEST(ByteTokenizer, IdsOutsideTheVocabularyAreErrors) {
  const ByteTokenizer tok;
  EXPECT_EMBER_ERROR(tok.decode({65, 257}), "id 257 at position 1", "0..256");
  EXPECT_EMBER_ERROR(tok.decode({-1}), "id -1 at position 0");
}

}  // namespace
