// config.json files with absurd sizes are refused before a model allocates anything, with an
// error naming the file and the field: sizes past 2^20, negative or zero sizes, heads that do not
// divide hidden_size, and sizes each in bounds whose product (hidden_size * intermediate_size
// * num_hidden_layers, say) implies more than 2^40 parameters.
#include <functional>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "nn/models/bert_config.h"
#include "nn/models/pretrained.h"
#include "test_util.h"

using namespace ember;
using namespace ember::nn;
using ember::testing::TempDir;

namespace {

// A small valid config.json with `field` set to `value` (a JSON literal).
std::string config_with(const std::string& field, const std::string& value) {
  BertConfig c = BertConfig::tiny(100);
  std::string text = c.to_json_string();
  const std::string key = "\"" + field + "\": ";
  const size_t at = text.find(key);
  if (at == std::string::npos) return text;
  const size_t start = at + key.size(), end = text.find_first_of(",\n}", start);
  return text.replace(start, end - start, value);
}

// Writes the config, loads it both ways, and expects each refusal to name the file and carry
// every fragment; the CPU allocator must not have reserved more than a little meanwhile.
void expect_refused(const std::string& field, const std::string& value, const std::vector<std::string>& fragments) {
  TempDir dir("config_bounds");
  const std::string path = dir.write("config.json", config_with(field, value));
  const int64_t reserved = cpu_allocator().stats().bytes_reserved;
  std::vector<std::string> want = fragments;
  want.push_back(path + ": ");
  want.push_back(field);
  for (const auto& load : std::vector<std::function<void()>>{
           [&] { BertConfig::from_json_file(path); },
           [&] { from_pretrained<BertForMaskedLM>(dir.path()); },
       }) {
    try {
      load();
      ADD_FAILURE() << field << " = " << value << " was accepted";
    } catch (const Error& e) {
      for (const std::string& frag : want)
        EXPECT_NE(std::string(e.what()).find(frag), std::string::npos)
            << field << " = " << value << ": message \"" << e.what() << "\" lacks \"" << frag << "\"";
    }
  }
  EXPECT_LE(cpu_allocator().stats().bytes_reserved - reserved, int64_t(1) << 20) << field << " = " << value;
}

}  // namespace

TEST(ConfigBounds, TheTinyConfigIsAccepted) {
  TempDir dir("config_bounds");
  const std::string path = dir.write("config.json", config_with("hidden_size", "128"));
  EXPECT_EQ(BertConfig::from_json_file(path).hidden_size, 128);
  // The estimate bounds the real count from above, closely (it adds the heads of every task).
  const BertConfig tiny = BertConfig::tiny(100);
  const double real = double(BertForMaskedLM(tiny).num_parameters());
  EXPECT_GE(tiny.parameter_count(), real);
  EXPECT_LE(tiny.parameter_count(), 1.1 * real);
}

TEST(ConfigBounds, SizesPastTwoToTheTwentiethAreRefused) {
  expect_refused("num_hidden_layers", "1000000000", {"num_hidden_layers = 1000000000 exceeds the bound 1048576"});
  expect_refused("hidden_size", "1099511627776", {"hidden_size = 1099511627776 exceeds the bound 1048576"});
  expect_refused("vocab_size", "4611686018427387904", {"vocab_size = 4611686018427387904 exceeds the bound"});
  expect_refused("intermediate_size", "1048577", {"intermediate_size = 1048577 exceeds the bound"});
  expect_refused("max_position_embeddings", "9000000000000", {"max_position_embeddings = 9000000000000 exceeds"});
  expect_refused("type_vocab_size", "2000000", {"type_vocab_size = 2000000 exceeds"});
  expect_refused("num_attention_heads", "1048577", {"num_attention_heads = 1048577 exceeds"});
}

TEST(ConfigBounds, NegativeAndZeroSizesAreRefused) {
  expect_refused("num_hidden_layers", "-3", {"num_hidden_layers must be positive, got -3"});
  expect_refused("intermediate_size", "-512", {"intermediate_size must be positive, got -512"});
  expect_refused("vocab_size", "-1", {"vocab_size must be positive, got -1"});
  expect_refused("hidden_size", "0", {"hidden_size must be positive, got 0"});
  expect_refused("num_attention_heads", "0", {"num_attention_heads must be positive, got 0"});
}

TEST(ConfigBounds, HeadsMustDivideTheHiddenSize) {
  expect_refused("num_attention_heads", "3", {"hidden_size 128 is not a multiple of num_attention_heads 3"});
}

TEST(ConfigBounds, SizesInBoundsWhoseProductIsHugeAreRefused) {
  // 128 x 2^20 per FFN matrix is in bounds; with 2^20 layers it is 2^48 parameters.
  TempDir dir("config_bounds");
  std::string text = config_with("intermediate_size", "1048576");
  const size_t at = text.find("\"num_hidden_layers\": ");
  text.replace(at, text.find(',', at) - at, "\"num_hidden_layers\": 1048576");
  const std::string path = dir.write("config.json", text);
  const int64_t reserved = cpu_allocator().stats().bytes_reserved;
  EXPECT_EMBER_ERROR(BertConfig::from_json_file(path), path + ": ", "intermediate_size 1048576",
                     "num_hidden_layers 1048576", "more than the bound 2^40");
  EXPECT_EMBER_ERROR(from_pretrained<BertForSequenceClassification>(dir.path()), path + ": ", "more than the bound 2^40");
  EXPECT_LE(cpu_allocator().stats().bytes_reserved - reserved, int64_t(1) << 20);
  // hidden_size = intermediate_size = 2^20: the product 2^40 per matrix alone.
  expect_refused("hidden_size", "1048576", {"hidden_size 1048576", "more than the bound 2^40"});
}

TEST(ConfigBounds, NumbersPastInt64AreRefusedNamingTheField) {
  expect_refused("hidden_size", "100000000000000000000000000000", {"field 'hidden_size' must be an integer"});
  expect_refused("vocab_size", "18446744073709551615", {"field 'vocab_size' = 18446744073709551615 does not fit"});
}

TEST(ConfigBounds, LayerNormEpsAndInitializerRangeMustBeSensible) {
  expect_refused("layer_norm_eps", "-1e-12", {"layer_norm_eps must be positive and finite"});
  expect_refused("layer_norm_eps", "0", {"layer_norm_eps must be positive and finite"});
  expect_refused("initializer_range", "-0.02", {"initializer_range must be non-negative and finite"});
}
