// Inputs that once crashed a file reader (found by the fuzz/ targets and by probing the limits
// they cannot reach within -max_len). Each must now fail with an ember::Error naming the file.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <functional>
#include <string>

#include "core/error.h"
#include "data/idx_file.h"
#include "data/tsv_dataset.h"
#include "data/wordpiece_tokenizer.h"
#include "nn/io/json_config.h"
#include "nn/io/safetensors.h"
#include "test_util.h"

namespace {

using ember::testing::TempDir;

std::string nested(size_t depth, const std::string& inner = "") {
  return std::string(depth, '[') + inner + std::string(depth, ']');
}

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ember::Error& e) {
    return e.what();
  }
  return "<no ember::Error>";
}

// config.json of 200,000 nested arrays: parsing succeeded, then dump() (and any error message
// showing the value) recursed once per level and overflowed the stack (ASan: stack-overflow in
// nlohmann's serializer). Now refused while parsing.
TEST(FuzzRegressions, ConfigJsonDeepNestingIsRefused) {
  TempDir dir("fuzz_regressions");
  const std::string path = dir.write("config.json", "{\"a\":" + nested(200000) + "}");
  const std::string msg = message_of([&] { ember::nn::JsonConfig::load(path).dump(); });
  EXPECT_NE(msg.find(path + ": invalid JSON: arrays and objects nested more than 1000 levels deep (at offset 1004)"),
            std::string::npos)
      << msg;
}

TEST(FuzzRegressions, ConfigJsonDeepObjectsAreRefused) {
  std::string text;
  for (int i = 0; i < 5000; ++i) text += "{\"k\":";
  text += "1" + std::string(5000, '}');
  const std::string msg = message_of([&] { ember::nn::JsonConfig::parse(text, "deep.json"); });
  EXPECT_NE(msg.find("deep.json: invalid JSON: arrays and objects nested more than 1000 levels deep"),
            std::string::npos)
      << msg;
}

// Brackets inside strings are text, not nesting; 1000 levels are still accepted.
TEST(FuzzRegressions, ConfigJsonDepthLimitIsExact) {
  const std::string brackets_in_string = "{\"a\": \"" + std::string(5000, '[') + "\\\"[\"}";
  EXPECT_EQ(ember::nn::JsonConfig::parse(brackets_in_string).get<std::string>("a").size(), 5002u);
  EXPECT_NO_THROW(ember::nn::JsonConfig::parse("{\"a\":" + nested(999) + "}").dump());
  const std::string msg = message_of([&] { ember::nn::JsonConfig::parse("{\"a\":" + nested(1000) + "}"); });
  EXPECT_NE(msg.find("nested more than 1000 levels deep"), std::string::npos) << msg;
}

// A safetensors header of 200,000 nested arrays as a tensor entry: the error message
// ("entry must be an object, got [[[[...") serialised the value and overflowed the stack.
TEST(FuzzRegressions, SafetensorsDeepHeaderIsRefused) {
  TempDir dir("fuzz_regressions");
  const std::string header = "{\"w\":" + nested(200000) + "}";
  std::string bytes;
  for (int i = 0; i < 8; ++i) bytes.push_back(char((uint64_t(header.size()) >> (8 * i)) & 0xff));
  const std::string path = dir.write("deep.safetensors", bytes + header);
  const std::string msg = message_of([&] { ember::nn::load_safetensors(path); });
  EXPECT_NE(msg.find("load_safetensors: " + path + ": header: invalid JSON: arrays and objects nested more than 1000"),
            std::string::npos)
      << msg;
}

// fuzz_tsv_dataset, crash-e172c128: with num_labels <= 0 any non-negative label was accepted, and
// label_counts() then resized a vector to label + 1 = 110445766447492118 entries (ASan: allocator
// out of memory; without ASan std::bad_alloc, not an ember::Error). Labels are now bounded by
// kMaxLabels and the line is named.
TEST(FuzzRegressions, TsvHugeLabelWithoutNumLabels) {
  const std::string path = std::string(EMBER_SOURCE_DIR) + "/tests/io/fuzz_regressions/tsv_huge_label_no_num_labels.tsv";
  ember::data::LabeledTsvOptions o;
  o.has_header = false;
  o.num_labels = 0;
  const std::string msg = message_of([&] { ember::data::read_labeled_tsv(path, o).label_counts(); });
  EXPECT_NE(msg.find("tsv: " + path + ":1: bad label '11044576644749'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(expected an integer in [0, 16777216))"), std::string::npos) << msg;

  TempDir dir("fuzz_regressions");
  const std::string small = dir.write("l.tsv", "a\t7\nb\t16777216\n");
  const std::string m2 = message_of([&] { ember::data::read_labeled_tsv(small, o); });
  EXPECT_NE(m2.find(small + ":2: bad label '16777216' (expected an integer in [0, 16777216))"), std::string::npos) << m2;

  ember::data::LabeledTexts texts;
  texts.texts = {"x"};
  texts.labels = {int64_t(1) << 40};
  const std::string m3 = message_of([&] { texts.label_counts(); });
  EXPECT_NE(m3.find("label_counts: label 1099511627776 is outside [0, 16777216)"), std::string::npos) << m3;
}

// A float IDX file with a zero dimension (bytes 00 00 0d 02, dims 0 and 0x00dcdd3e): an empty
// array, whose conversion to a tensor passed the empty tensor's null data pointer to memcpy
// (UBSan: null pointer passed as argument 1). Now an empty f32 tensor of that shape.
TEST(FuzzRegressions, IdxEmptyFloatArrayBecomesAnEmptyTensor) {
  TempDir dir("fuzz_regressions");
  const std::string path = dir.write("empty.idx", std::string("\x00\x00\x0d\x02\x00\x00\x00\x00\x00\xdc\xdd\x3e", 12));
  const ember::data::IdxArray array = ember::data::read_idx(path);
  const ember::Tensor t = array.to_tensor();
  EXPECT_EQ(t.dtype(), ember::DType::f32);
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(t.shape(), (ember::Shape{0, 0x00dcdd3e}));
}

// A single 300,000-character word: must become [UNK] (longer than kMaxWordChars) in linear time.
TEST(FuzzRegressions, TokenizerHugeWordIsUnk) {
  ember::data::WordPieceTokenizer tok({"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a"});
  const auto pieces = tok.tokenize(std::string(300000, 'a'));
  ASSERT_EQ(pieces.size(), 1u);
  EXPECT_EQ(pieces[0], "[UNK]");
}

}  // namespace
