// JsonConfig: typed getters whose errors name the file, field, expected and actual type;
// strict parsing; pretty, atomic writing in the layout transformers uses for config.json.
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "nn/io/json_config.h"
#include "test_util.h"

using namespace ember;
using namespace ember::nn;
using ember::testing::TempDir;
namespace fs = std::filesystem;

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// A slice of a real BERT config.json, plus fields of every other kind.
const char* kBertLike = R"({
  "architectures": ["BertForMaskedLM"],
  "attention_probs_dropout_prob": 0.1,
  "classifier_dropout": null,
  "hidden_size": 768,
  "id2label": {"0": "NEGATIVE", "1": "POSITIVE"},
  "label2id": {"NEGATIVE": 0, "POSITIVE": 1},
  "layer_norm_eps": 1e-12,
  "model_type": "bert",
  "num_attention_heads": 12,
  "tie_word_embeddings": true,
  "vocab_size": 30522,
  "big": 9007199254740993,
  "huge": 18446744073709551615,
  "ratio": 2,
  "shape": [2, 3, 4],
  "mixed": [1, "two", 3],
  "task": {"labels": {"0": "a", "1": 5}, "depth": 3}
})";

JsonConfig bert() { return JsonConfig::parse(kBertLike, "config.json"); }

}  // namespace

TEST(JsonConfig, ReadsEveryType) {
  JsonConfig c = bert();
  EXPECT_EQ(c.get<int>("hidden_size"), 768);
  EXPECT_EQ(c.get<int64_t>("vocab_size"), 30522);
  EXPECT_EQ(c.get<int64_t>("big"), 9007199254740993LL);  // exact: not routed through double
  EXPECT_DOUBLE_EQ(c.get<double>("layer_norm_eps"), 1e-12);
  EXPECT_FLOAT_EQ(c.get<float>("attention_probs_dropout_prob"), 0.1f);
  EXPECT_EQ(c.get<double>("ratio"), 2.0);  // integers are numbers too
  EXPECT_TRUE(c.get<bool>("tie_word_embeddings"));
  EXPECT_EQ(c.get<std::string>("model_type"), "bert");
  EXPECT_EQ(c.get<std::vector<std::string>>("architectures"), std::vector<std::string>{"BertForMaskedLM"});
  EXPECT_EQ(c.get<std::vector<int64_t>>("shape"), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(c.get<std::vector<int>>("shape"), (std::vector<int>{2, 3, 4}));
  EXPECT_EQ(c.get<std::vector<double>>("shape"), (std::vector<double>{2, 3, 4}));
  EXPECT_EQ((c.get<std::map<std::string, std::string>>("id2label")),
            (std::map<std::string, std::string>{{"0", "NEGATIVE"}, {"1", "POSITIVE"}}));
  EXPECT_EQ((c.get<std::map<std::string, int64_t>>("label2id")),
            (std::map<std::string, int64_t>{{"NEGATIVE", 0}, {"POSITIVE", 1}}));
  EXPECT_EQ(c.get_object("task").get<int>("depth"), 3);
  EXPECT_TRUE(c.contains("classifier_dropout"));
  EXPECT_FALSE(c.contains("pad_token_id"));
  EXPECT_EQ(c.keys().size(), 17u);
  EXPECT_EQ(c.source(), "config.json");
}

TEST(JsonConfig, OptionalAndFallbackTreatNullAsAbsent) {
  JsonConfig c = bert();
  EXPECT_FALSE(c.get_optional<double>("classifier_dropout").has_value());
  EXPECT_FALSE(c.get_optional<int>("pad_token_id").has_value());
  EXPECT_EQ(c.get_optional<int>("hidden_size"), 768);
  EXPECT_EQ(c.get("pad_token_id", 0), 0);
  EXPECT_EQ(c.get("classifier_dropout", 0.25), 0.25);
  EXPECT_EQ(c.get("hidden_size", 1), 768);
  EXPECT_EQ(c.get<std::string>("position_embedding_type", "absolute"), "absolute");
  // A present field of the wrong type is still an error, not silently replaced by the fallback.
  EXPECT_EMBER_ERROR(c.get("model_type", 1), "config.json: field 'model_type' must be an integer, got string");
  EXPECT_EMBER_ERROR(c.get_optional<bool>("hidden_size"), "field 'hidden_size' must be a boolean, got integer");
}

TEST(JsonConfig, WrongTypeNamesFileFieldExpectedAndActual) {
  JsonConfig c = bert();
  EXPECT_EMBER_ERROR(c.get<int>("model_type"), "config.json: field 'model_type' must be an integer, got string");
  EXPECT_EMBER_ERROR(c.get<int64_t>("layer_norm_eps"), "config.json: field 'layer_norm_eps' must be an integer, got float");
  EXPECT_EMBER_ERROR(c.get<double>("model_type"), "config.json: field 'model_type' must be a number, got string");
  EXPECT_EMBER_ERROR(c.get<bool>("hidden_size"), "config.json: field 'hidden_size' must be a boolean, got integer");
  EXPECT_EMBER_ERROR(c.get<std::string>("tie_word_embeddings"),
                     "config.json: field 'tie_word_embeddings' must be a string, got boolean");
  EXPECT_EMBER_ERROR(c.get<std::string>("architectures"), "field 'architectures' must be a string, got array");
  EXPECT_EMBER_ERROR(c.get<std::vector<int>>("model_type"), "field 'model_type' must be an array, got string");
  EXPECT_EMBER_ERROR(c.get<double>("classifier_dropout"), "field 'classifier_dropout' must be a number, got null");
  EXPECT_EMBER_ERROR(c.get<int>("id2label"), "field 'id2label' must be an integer, got object");
  EXPECT_EMBER_ERROR(c.get_object("hidden_size"), "field 'hidden_size' must be an object, got integer");
}

TEST(JsonConfig, ElementErrorsNameTheElement) {
  JsonConfig c = bert();
  EXPECT_EMBER_ERROR(c.get<std::vector<int64_t>>("mixed"), "config.json: field 'mixed[1]' must be an integer, got string");
  EXPECT_EMBER_ERROR((c.get<std::map<std::string, int64_t>>("id2label")),
                     "config.json: field 'id2label.0' must be an integer, got string");
  JsonConfig task = c.get_object("task");
  EXPECT_EMBER_ERROR((task.get<std::map<std::string, std::string>>("labels")),
                     "config.json: field 'task.labels.1' must be a string, got integer");
  EXPECT_EMBER_ERROR(task.get<int>("width"), "config.json: missing required field 'task.width'");
  EXPECT_EMBER_ERROR(task.get_object("labels").get<int>("0"), "field 'task.labels.0' must be an integer, got string");
}

TEST(JsonConfig, MissingRequiredField) {
  EXPECT_EMBER_ERROR(bert().get<int>("intermediate_size"), "config.json: missing required field 'intermediate_size'");
}

TEST(JsonConfig, IntegersMustFitTheirType) {
  JsonConfig c = bert();
  EXPECT_EMBER_ERROR(c.get<int>("big"), "config.json: field 'big' = 9007199254740993 does not fit in a 32-bit integer");
  EXPECT_EMBER_ERROR(c.get<int64_t>("huge"), "field 'huge' = 18446744073709551615 does not fit in a 64-bit integer");
  c.set("neg", int64_t(-3000000000));
  EXPECT_EMBER_ERROR(c.get<int>("neg"), "field 'neg' = -3000000000 does not fit in a 32-bit integer");
  c.set("large", 1e300);
  EXPECT_EMBER_ERROR(c.get<float>("large"), "does not fit in a 32-bit float");
  EXPECT_EQ(c.get<double>("large"), 1e300);
  c.set("int_max", std::numeric_limits<int>::max());
  EXPECT_EQ(c.get<int>("int_max"), std::numeric_limits<int>::max());
}

TEST(JsonConfig, ParseErrorsNameTheSource) {
  EXPECT_EMBER_ERROR(JsonConfig::parse("{\"a\": 1,}", "broken.json"), "broken.json: invalid JSON", "line 1");
  EXPECT_EMBER_ERROR(JsonConfig::parse("{\"a\": 1} trailing", "broken.json"), "broken.json: invalid JSON");
  EXPECT_EMBER_ERROR(JsonConfig::parse(std::string("{}\0x", 4), "nul.json"), "nul.json: invalid JSON: NUL byte at offset 2");
  EXPECT_EMBER_ERROR(JsonConfig::parse("[1, 2]", "list.json"), "list.json: expected a JSON object at the top level, got array");
  EXPECT_EMBER_ERROR(JsonConfig::parse("", "empty.json"), "empty.json: invalid JSON");
  EXPECT_EMBER_ERROR(JsonConfig::parse("{\"a\": \"\xff\"}", "bytes.json"), "bytes.json: invalid JSON");
  // The DOM parser would keep the last value silently; a repeated key is almost always a mistake.
  EXPECT_EMBER_ERROR(JsonConfig::parse("{\"a\": 1, \"b\": {\"c\": 1, \"c\": 2}}", "dup.json"),
                     "dup.json: invalid JSON: duplicate key 'c'");
  // The same key in different objects is fine.
  EXPECT_EQ(JsonConfig::parse("{\"c\": 1, \"b\": {\"c\": 2}}").get_object("b").get<int>("c"), 2);
  EXPECT_EMBER_ERROR(JsonConfig(nlohmann::json::array(), "made.json"), "made.json: expected a JSON object, got array");
}

TEST(JsonConfig, LoadErrorsNameThePath) {
  TempDir dir{"ember_json_config"};
  const std::string missing = dir.file("config.json");
  EXPECT_EMBER_ERROR(JsonConfig::load(missing), "cannot open '" + missing + "'", "No such file or directory");
  EXPECT_EMBER_ERROR(JsonConfig::load(dir.path()), "cannot read '" + dir.path() + "': not a regular file");
  write_text(missing, "{\"hidden_size\": \"768\"}");
  EXPECT_EMBER_ERROR(JsonConfig::load(missing).get<int>("hidden_size"),
                     missing + ": field 'hidden_size' must be an integer, got string");
  write_text(missing, "{\"hidden_size\": 768");
  EXPECT_EMBER_ERROR(JsonConfig::load(missing), missing + ": invalid JSON", "unexpected end of input");
}

TEST(JsonConfig, SaveWritesSortedPrettyJsonAtomically) {
  TempDir dir{"ember_json_config"};
  const std::string path = dir.file("config.json");
  JsonConfig c;
  c.set("vocab_size", 30522).set("model_type", "bert").set("layer_norm_eps", 1e-12).set("hidden_dropout_prob", 0.1);
  c.set("architectures", std::vector<std::string>{"BertModel"}).set("tie", true).set_null("classifier_dropout");
  c.set("name", std::string("caf\xc3\xa9"));
  JsonConfig inner;
  inner.set("b", 2).set("a", 1);
  c.set_object("nested", inner);
  c.save(path);
  // transformers writes json.dumps(d, indent=2, sort_keys=True) + "\n" (ASCII-escaped).
  EXPECT_EQ(read_text(path),
            "{\n"
            "  \"architectures\": [\n    \"BertModel\"\n  ],\n"
            "  \"classifier_dropout\": null,\n"
            "  \"hidden_dropout_prob\": 0.1,\n"
            "  \"layer_norm_eps\": 1e-12,\n"
            "  \"model_type\": \"bert\",\n"
            "  \"name\": \"caf\\u00e9\",\n"
            "  \"nested\": {\n    \"a\": 1,\n    \"b\": 2\n  },\n"
            "  \"tie\": true,\n"
            "  \"vocab_size\": 30522\n"
            "}\n");
  JsonConfig back = JsonConfig::load(path);
  EXPECT_EQ(back.json(), c.json());
  EXPECT_EQ(back.get<std::string>("name"), "caf\xc3\xa9");
  EXPECT_EQ(back.get_object("nested").get<int>("a"), 1);
  // Only the final file remains in the directory.
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) entries += e.path().filename() == "config.json" ? 1 : 100;
  EXPECT_EQ(entries, 1);

  EXPECT_TRUE(c.erase("tie"));
  EXPECT_FALSE(c.erase("tie"));
  c.save(path);
  EXPECT_FALSE(JsonConfig::load(path).contains("tie"));
}

TEST(JsonConfig, SaveRefusesInvalidUtf8AndMissingDirectory) {
  TempDir dir{"ember_json_config"};
  JsonConfig c;
  c.set("bad", std::string("\xff"));
  EXPECT_EMBER_ERROR(c.dump(), "<config>: cannot write JSON", "UTF-8");
  JsonConfig ok;
  const std::string path = dir.file("missing/config.json");
  EXPECT_EMBER_ERROR(ok.save(path), "cannot create a temporary file", path, "No such file or directory");
}
