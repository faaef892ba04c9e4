// The bad-input catalogue: one test per malformed file a user can hand Ember's readers, each
// asserting the exact ember::Error (which file, what is wrong). The readers must refuse these
// with an ember::Error, never crash, hang or silently truncate.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "accelerate/launch_config.h"
#include "core/error.h"
#include "data/tsv_dataset.h"
#include "data/wordpiece_tokenizer.h"
#include "nn/io/json_config.h"
#include "nn/io/safetensors.h"
#include "nn/models/bert_config.h"
#include "test_util.h"

namespace {

using ember::testing::TempDir;

// An 8-byte little-endian header length, the header, then the data buffer.
std::string safetensors_bytes(const std::string& header, const std::string& data, uint64_t length) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(char((length >> (8 * i)) & 0xff));
  return out + header + data;
}
std::string safetensors_bytes(const std::string& header, const std::string& data = "") {
  return safetensors_bytes(header, data, header.size());
}

// Runs `fn`, which must throw ember::Error whose message contains every fragment.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& fragments) {
  try {
    fn();
  } catch (const ember::Error& e) {
    const std::string msg = e.what();
    if (std::getenv("EMBER_PRINT_ERRORS")) std::printf("%s\n", msg.c_str());
    for (const std::string& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected ember::Error, got another exception: " << e.what();
    return;
  }
  ADD_FAILURE() << "expected ember::Error, nothing was thrown";
}

void expect_load_error(const std::string& path, const std::vector<std::string>& fragments) {
  std::vector<std::string> all{"load_safetensors: " + path + ": "};
  all.insert(all.end(), fragments.begin(), fragments.end());
  expect_error([&] { ember::nn::load_safetensors(path); }, all);
  expect_error([&] { ember::nn::read_safetensors_header(path); }, all);
}

const std::string kF32x2 = R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";

// ---- safetensors

TEST(BadInputs, SafetensorsEmptyFile) {
  TempDir dir("bad_inputs");
  expect_load_error(dir.write("empty.safetensors", ""), {"file is 0 bytes, too short for the 8-byte header length"});
}

TEST(BadInputs, SafetensorsTruncatedHeaderLength) {
  TempDir dir("bad_inputs");
  expect_load_error(dir.write("short.safetensors", std::string("\x10\x00\x00", 3)),
                    {"file is 3 bytes, too short for the 8-byte header length"});
}

TEST(BadInputs, SafetensorsTruncatedHeader) {
  TempDir dir("bad_inputs");
  const std::string header = "{" + kF32x2 + "}";
  // The length promises the whole header, but the file stops 10 bytes into it.
  const std::string bytes = safetensors_bytes(header, std::string(8, '\0')).substr(0, 18);
  expect_load_error(dir.write("cut.safetensors", bytes),
                    {"header length " + std::to_string(header.size()) + " runs past the end of the file (18 bytes)"});
}

TEST(BadInputs, SafetensorsHeaderCutInsideJson) {
  TempDir dir("bad_inputs");
  // A consistent length, but the JSON text itself stops half way.
  const std::string header = ("{" + kF32x2).substr(0, 20);
  expect_load_error(dir.write("halfjson.safetensors", safetensors_bytes(header)), {"invalid JSON"});
}

TEST(BadInputs, SafetensorsOversizedHeaderLength) {
  TempDir dir("bad_inputs");
  const std::string bytes = safetensors_bytes("{}", "", 200'000'000);
  expect_load_error(dir.write("huge.safetensors", bytes),
                    {"header length 200000000 is larger than the 100000000-byte limit"});
}

TEST(BadInputs, SafetensorsHeaderLengthTopBitSet) {
  TempDir dir("bad_inputs");
  const std::string bytes = safetensors_bytes("{}", "", 0xffffffffffffffffull);
  expect_load_error(dir.write("neg.safetensors", bytes),
                    {"header length 18446744073709551615 is larger than the 100000000-byte limit"});
}

TEST(BadInputs, SafetensorsOffsetsPastEnd) {
  TempDir dir("bad_inputs");
  const std::string header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  expect_load_error(dir.write("past.safetensors", safetensors_bytes(header, std::string(4, '\0'))),
                    {"tensor 'w': data_offsets [0, 8] run past the end of the data buffer (4 bytes)"});
}

TEST(BadInputs, SafetensorsOffsetsFarPastEnd) {
  TempDir dir("bad_inputs");
  // Sizes near 2^63 must not overflow into a small, plausible number.
  const std::string header =
      R"({"w":{"dtype":"I64","shape":[1152921504606846975],"data_offsets":[8,9223372036854775808]}})";
  expect_load_error(dir.write("far.safetensors", safetensors_bytes(header)), {"tensor 'w': data_offsets [8, 9223372036854775808] run past the end of the data buffer (0 bytes)"});
}

TEST(BadInputs, SafetensorsOverlappingTensors) {
  TempDir dir("bad_inputs");
  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  expect_load_error(dir.write("overlap.safetensors", safetensors_bytes(header, std::string(12, '\0'))),
                    {"tensors 'a' and 'b' overlap: 'b' starts at byte 4 before 'a' ends at byte 8"});
}

TEST(BadInputs, SafetensorsGapBetweenTensors) {
  TempDir dir("bad_inputs");
  const std::string header = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                             R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})";
  expect_load_error(dir.write("gap.safetensors", safetensors_bytes(header, std::string(12, '\0'))),
                    {"bytes [4, 8) of the data buffer belong to no tensor (gap before 'b')"});
}

TEST(BadInputs, SafetensorsTrailingBytes) {
  TempDir dir("bad_inputs");
  expect_load_error(dir.write("trail.safetensors", safetensors_bytes("{" + kF32x2 + "}", std::string(12, '\0'))),
                    {"the data buffer has 4 bytes after the last tensor"});
}

TEST(BadInputs, SafetensorsUnknownDtype) {
  TempDir dir("bad_inputs");
  const std::string header = R"({"w":{"dtype":"F7","shape":[2],"data_offsets":[0,8]}})";
  expect_load_error(dir.write("dtype.safetensors", safetensors_bytes(header, std::string(8, '\0'))),
                    {"tensor 'w': unknown dtype 'F7'"});
}

TEST(BadInputs, SafetensorsUnsupportedDtype) {
  TempDir dir("bad_inputs");
  const std::string header = R"({"w":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})";
  expect_load_error(dir.write("u8.safetensors", safetensors_bytes(header, std::string(8, '\0'))),
                    {"tensor 'w': dtype 'U8' is not supported"});
}

TEST(BadInputs, SafetensorsDtypeNotAString) {
  TempDir dir("bad_inputs");
  const std::string header = R"({"w":{"dtype":7,"shape":[2],"data_offsets":[0,8]}})";
  expect_load_error(dir.write("dtype7.safetensors", safetensors_bytes(header, std::string(8, '\0'))),
                    {"tensor 'w': 'dtype' must be a string"});
}

TEST(BadInputs, SafetensorsShapeByteMismatch) {
  TempDir dir("bad_inputs");
  const std::string header = R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})";
  expect_load_error(dir.write("mismatch.safetensors", safetensors_bytes(header, std::string(8, '\0'))),
                    {"tensor 'w': data_offsets [0, 8] span 8 bytes but shape [3] of F32 needs 12 bytes"});
}

TEST(BadInputs, SafetensorsNegativeShape) {
  TempDir dir("bad_inputs");
  const std::string header = R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})";
  expect_load_error(dir.write("negshape.safetensors", safetensors_bytes(header, std::string(8, '\0'))),
                    {"tensor 'w': shape entry 0 must be a non-negative integer"});
}

TEST(BadInputs, SafetensorsMissingDataOffsets) {
  TempDir dir("bad_inputs");
  const std::string header = R"({"w":{"dtype":"F32","shape":[2]}})";
  expect_load_error(dir.write("nooffs.safetensors", safetensors_bytes(header, std::string(8, '\0'))),
                    {"tensor 'w': missing 'data_offsets'"});
}

TEST(BadInputs, SafetensorsBeginAfterEnd) {
  TempDir dir("bad_inputs");
  const std::string header = R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})";
  expect_load_error(dir.write("rev.safetensors", safetensors_bytes(header, std::string(8, '\0'))),
                    {"tensor 'w': data_offsets [8, 0] have begin > end"});
}

TEST(BadInputs, SafetensorsHeaderNotAnObject) {
  TempDir dir("bad_inputs");
  expect_load_error(dir.write("array.safetensors", safetensors_bytes("[1, 2]")),
                    {"header must be a JSON object, got array"});
}

TEST(BadInputs, SafetensorsDuplicateKey) {
  TempDir dir("bad_inputs");
  const std::string header = "{" + kF32x2 + "," + kF32x2 + "}";
  expect_load_error(dir.write("dup.safetensors", safetensors_bytes(header, std::string(8, '\0'))),
                    {"duplicate key 'w'"});
}

TEST(BadInputs, SafetensorsBadBoolByte) {
  TempDir dir("bad_inputs");
  const std::string header = R"({"m":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})";
  const std::string path = dir.write("bool.safetensors", safetensors_bytes(header, std::string("\x01\x07", 2)));
  expect_error([&] { ember::nn::load_safetensors(path); },
               {path, "tensor 'm': BOOL element 1 has byte value 7 (must be 0 or 1)"});
}

TEST(BadInputs, SafetensorsMetadataNotStrings) {
  TempDir dir("bad_inputs");
  const std::string header = R"({"__metadata__":{"format":1},)" + kF32x2 + "}";
  expect_load_error(dir.write("meta.safetensors", safetensors_bytes(header, std::string(8, '\0'))),
                    {"'__metadata__' field 'format' must be a string, got"});
}

// ---- config.json

const std::string kBertConfig = R"({"vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 2,
  "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64})";

TEST(BadInputs, ConfigJsonMissingField) {
  TempDir dir("bad_inputs");
  const std::string path = dir.write("config.json", R"({"hidden_size": 32})");
  expect_error([&] { ember::nn::JsonConfig::load(path).get<int64_t>("vocab_size"); },
               {path, ": missing required field 'vocab_size'"});
}

TEST(BadInputs, ConfigJsonWrongTypedField) {
  TempDir dir("bad_inputs");
  const std::string path = dir.write("config.json", R"({"hidden_size": "32"})");
  expect_error([&] { ember::nn::JsonConfig::load(path).get<int64_t>("hidden_size"); },
               {path, ": field 'hidden_size' must be an integer, got string"});
}

TEST(BadInputs, ConfigJsonFloatForInteger) {
  TempDir dir("bad_inputs");
  const std::string path = dir.write("config.json", R"({"hidden_size": 32.5})");
  expect_error([&] { ember::nn::JsonConfig::load(path).get<int>("hidden_size"); },
               {path, ": field 'hidden_size' must be an integer, got float"});
}

TEST(BadInputs, ConfigJsonIntegerOutOfRange) {
  TempDir dir("bad_inputs");
  const std::string path = dir.write("config.json", R"({"hidden_size": 4294967296})");
  expect_error([&] { ember::nn::JsonConfig::load(path).get<int>("hidden_size"); }, {path, ": field 'hidden_size' = 4294967296 does not fit in a 32-bit integer"});
}

TEST(BadInputs, ConfigJsonNestedWrongType) {
  TempDir dir("bad_inputs");
  const std::string path = dir.write("config.json", R"({"id2label": {"0": 5}})");
  expect_error([&] { ember::nn::JsonConfig::load(path).get<std::map<std::string, std::string>>("id2label"); },
               {path, ": field 'id2label.0' must be a string, got integer"});
}

TEST(BadInputs, ConfigJsonNotAnObject) {
  TempDir dir("bad_inputs");
  const std::string path = dir.write("config.json", "[1, 2, 3]");
  expect_error([&] { ember::nn::JsonConfig::load(path); }, {path, ": expected a JSON object at the top level, got array"});
}

TEST(BadInputs, ConfigJsonTrailingGarbage) {
  TempDir dir("bad_inputs");
  const std::string path = dir.write("config.json", R"({"a": 1} x)");
  expect_error([&] { ember::nn::JsonConfig::load(path); }, {path, ": invalid JSON"});
}

TEST(BadInputs, ConfigJsonTruncated) {
  TempDir dir("bad_inputs");
  const std::string path = dir.write("config.json", kBertConfig.substr(0, 40));
  expect_error([&] { ember::nn::JsonConfig::load(path); }, {path, ": invalid JSON"});
}

TEST(BadInputs, BertConfigMissingField) {
  TempDir dir("bad_inputs");
  const std::string path = dir.write("config.json", R"({"hidden_size": 32})");
  expect_error([&] { ember::nn::BertConfig::from_json_file(path); }, {path, ": missing required field 'vocab_size'"});
}

TEST(BadInputs, BertConfigWrongTypedField) {
  TempDir dir("bad_inputs");
  std::string text = kBertConfig;
  text.replace(text.find("32"), 2, "\"32\"");
  const std::string path = dir.write("config.json", text);
  expect_error([&] { ember::nn::BertConfig::from_json_file(path); },
               {path, "field 'hidden_size' must be an integer, got string"});
}

// ---- launch config YAML

TEST(BadInputs, LaunchConfigWrongTypedKey) {
  TempDir dir("bad_inputs");
  const std::string path = dir.write("default_config.yaml", "num_processes: four\n");
  expect_error([&] { ember::distributed::LaunchConfig::load_yaml(path); }, {path, ": key 'num_processes': expected an integer, got 'four'"});
}

TEST(BadInputs, LaunchConfigUnknownKey) {
  TempDir dir("bad_inputs");
  const std::string path = dir.write("default_config.yaml", "num_procs: 2\n");
  expect_error([&] { ember::distributed::LaunchConfig::load_yaml(path); }, {path, ": unknown key 'num_procs' (known keys: "});
}

TEST(BadInputs, LaunchConfigSyntaxError) {
  TempDir dir("bad_inputs");
  const std::string path = dir.write("default_config.yaml", "num_processes: [2\n");
  expect_error([&] { ember::distributed::LaunchConfig::load_yaml(path); }, {path, ": YAML syntax error at line 2"});
}

// ---- vocabulary

TEST(BadInputs, VocabWithoutUnk) {
  TempDir dir("bad_inputs");
  const std::string path = dir.write("vocab.txt", "[PAD]\n[CLS]\n[SEP]\n[MASK]\nthe\n");
  expect_error([&] { ember::data::WordPieceTokenizer::from_file(path); }, {path, "lacks the special token(s) [UNK]"});
}

TEST(BadInputs, VocabEmpty) {
  TempDir dir("bad_inputs");
  const std::string path = dir.write("vocab.txt", "");
  expect_error([&] { ember::data::WordPieceTokenizer::from_file(path); }, {path, "is empty"});
}

TEST(BadInputs, VocabMissingFile) {
  TempDir dir("bad_inputs");
  const std::string path = dir.file("nope.txt");
  expect_error([&] { ember::data::WordPieceTokenizer::from_file(path); }, {"cannot open '" + path + "': file not found"});
}

// ---- TSV datasets

TEST(BadInputs, TsvWrongNumberOfColumns) {
  TempDir dir("bad_inputs");
  const std::string path = dir.write("train.tsv", "sentence\tlabel\ngood film \t1\nbad\tfilm \t0\n");
  expect_error([&] { ember::data::read_labeled_tsv(path); },
               {"tsv: " + path + ":3: expected 2 tab-separated columns, found 3"});
}

TEST(BadInputs, TsvMissingColumn) {
  TempDir dir("bad_inputs");
  const std::string path = dir.write("train.tsv", "sentence\tlabel\ngood film \t1\nno label here\n");
  expect_error([&] { ember::data::read_labeled_tsv(path); },
               {"tsv: " + path + ":3: expected 2 tab-separated columns, found 1"});
}

TEST(BadInputs, TsvBadLabel) {
  TempDir dir("bad_inputs");
  const std::string path = dir.write("train.tsv", "sentence\tlabel\ngood film \tpositive\n");
  expect_error([&] { ember::data::read_labeled_tsv(path); },
               {"tsv: " + path + ":2: bad label 'positive' (expected an integer in [0, 2))"});
}

TEST(BadInputs, TsvLabelOutOfRange) {
  TempDir dir("bad_inputs");
  const std::string path = dir.write("train.tsv", "sentence\tlabel\ngood film \t2\n");
  expect_error([&] { ember::data::read_labeled_tsv(path); },
               {"tsv: " + path + ":2: bad label '2' (expected an integer in [0, 2))"});
}

TEST(BadInputs, TsvNegativeLabel) {
  TempDir dir("bad_inputs");
  const std::string path = dir.write("train.tsv", "sentence\tlabel\ngood film \t-1\n");
  expect_error([&] { ember::data::read_labeled_tsv(path); }, {"tsv: " + path + ":2: bad label '-1'"});
}

TEST(BadInputs, TsvMissingLabelColumn) {
  TempDir dir("bad_inputs");
  const std::string path = dir.write("train.tsv", "sentence\tscore\ngood film \t1\n");
  expect_error([&] { ember::data::read_labeled_tsv(path); }, {"tsv: " + path + ":1: header has no column 'label'"});
}

TEST(BadInputs, TsvEmptyFile) {
  TempDir dir("bad_inputs");
  const std::string path = dir.write("train.tsv", "");
  expect_error([&] { ember::data::read_labeled_tsv(path); }, {"tsv: '" + path + "' is empty (expected a header line)"});
}

TEST(BadInputs, TsvCorruptGzip) {
  TempDir dir("bad_inputs");
  // A gzip magic number followed by garbage.
  const std::string path = dir.write("train.tsv.gz", std::string("\x1f\x8b\x08\x00garbage-not-deflate", 23));
  expect_error([&] { ember::data::read_labeled_tsv(path); }, {"cannot read '" + path + "' (corrupt gzip data?)"});
}

}  // namespace
