// Sharded data parallel through the environment (accelerate/fsdp_env.h): every variable read,
// every bad value named with its variable, and fsdp_env() read back to the same options.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "accelerate/fsdp_env.h"
#include "accelerate/fsdp_settings.h"
#include "fsdp_options_expect.h"
#include "test_util.h"

namespace ember::distributed {
namespace {

// Every variable the reader looks at, cleared for the test and restored after it, so a value in
// the environment the tests run under cannot leak in.
class FSDPEnvTest : public ::testing::Test {
 protected:
  FSDPEnvTest() {
    std::vector<std::string> names = {"EMBER_USE_FSDP", "EMBER_FSDP_CPU_OFFLOAD"};
    for (const FSDPSetting& setting : fsdp_settings()) names.push_back(setting.variable);
    for (const std::string& name : names) {
      if (const char* old = std::getenv(name.c_str())) saved_[name] = old;
      else saved_[name] = std::nullopt;
      ::unsetenv(name.c_str());
    }
  }
  ~FSDPEnvTest() override {
    for (const auto& [name, value] : saved_) {
      if (value) ::setenv(name.c_str(), value->c_str(), 1);
      else ::unsetenv(name.c_str());
    }
  }
  void set(const std::string& name, const std::string& value) { ::setenv(name.c_str(), value.c_str(), 1); }
  void set_all(const std::vector<std::pair<std::string, std::string>>& variables) {
    for (const auto& [name, value] : variables) set(name, value);
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

TEST_F(FSDPEnvTest, UnsetOrFalseMeansNoSharding) {
  EXPECT_FALSE(fsdp_options_from_env().has_value());
  // The fields alone do not turn it on.
  set("EMBER_FSDP_SHARDING_STRATEGY", "SHARD_GRAD_OP");
  EXPECT_FALSE(fsdp_options_from_env().has_value());
  for (const char* off : {"false", "0", "FALSE", ""}) {
    set("EMBER_USE_FSDP", off);
    EXPECT_FALSE(fsdp_options_from_env().has_value()) << off;
  }
  for (const char* on : {"true", "1", "True"}) {
    set("EMBER_USE_FSDP", on);
    ASSERT_TRUE(fsdp_options_from_env().has_value()) << on;
  }
  set("EMBER_USE_FSDP", "maybe");
  EXPECT_EMBER_ERROR(fsdp_options_from_env(), "EMBER_USE_FSDP", "'maybe'", "true, false, 1, 0");
}

TEST_F(FSDPEnvTest, DefaultsWhenOnlyTurnedOn) {
  set("EMBER_USE_FSDP", "1");
  ember::testing::expect_same_fsdp_options(*fsdp_options_from_env(), FSDPOptions{});
}

TEST_F(FSDPEnvTest, EveryVariableIsRead) {
  set_all({{"EMBER_USE_FSDP", "true"},
           {"EMBER_FSDP_SHARDING_STRATEGY", "shard_grad_op"},
           {"EMBER_FSDP_AUTO_WRAP_POLICY", "SIZE_BASED_WRAP"},
           {"EMBER_FSDP_TRANSFORMER_CLS_TO_WRAP", "BertLayer, BertEmbeddings"},
           {"EMBER_FSDP_MIN_NUM_PARAMS", "2048"},
           {"EMBER_FSDP_RESHARD_AFTER_FORWARD", "false"},
           {"EMBER_FSDP_FORWARD_PREFETCH", "0"},
           {"EMBER_FSDP_BACKWARD_PREFETCH", "NO_PREFETCH"},
           {"EMBER_FSDP_ACTIVATION_CHECKPOINTING", "1"},
           {"EMBER_FSDP_STATE_DICT_TYPE", "FULL_STATE_DICT"},
           {"EMBER_FSDP_REDUCE_DTYPE", "bf16"},
           {"EMBER_FSDP_PARAM_DTYPE", "f16"},
           {"EMBER_FSDP_OFFLOAD_PARAMS", "false"}});
  const FSDPOptions o = *fsdp_options_from_env();
  EXPECT_EQ(o.sharding_strategy, ShardingStrategy::SHARD_GRAD_OP);
  EXPECT_EQ(o.auto_wrap_policy, AutoWrapPolicy::SIZE_BASED_WRAP);
  EXPECT_EQ(o.transformer_layer_cls_to_wrap, (std::vector<std::string>{"BertLayer", "BertEmbeddings"}));
  EXPECT_EQ(o.min_num_params, 2048);
  ASSERT_TRUE(o.reshard_after_forward.has_value());
  EXPECT_FALSE(*o.reshard_after_forward);
  EXPECT_FALSE(o.forward_prefetch);
  EXPECT_EQ(o.backward_prefetch, BackwardPrefetch::NO_PREFETCH);
  EXPECT_TRUE(o.activation_checkpointing);
  EXPECT_EQ(o.state_dict_type, StateDictType::FULL_STATE_DICT);
  EXPECT_EQ(o.mixed_precision.reduce_dtype, DType::bf16);
  EXPECT_EQ(o.mixed_precision.param_dtype, DType::f16);
  EXPECT_FALSE(o.cpu_offload);
}

TEST_F(FSDPEnvTest, BadValuesNameTheVariableTheValueAndTheChoices) {
  set("EMBER_USE_FSDP", "true");
  const std::vector<std::vector<std::string>> cases = {
      {"EMBER_FSDP_SHARDING_STRATEGY", "ZERO3", "FULL_SHARD, SHARD_GRAD_OP, SHARD_OPTIMIZER or NO_SHARD"},
      // Accelerate's numbers are refused with the map from stages to names.
      {"EMBER_FSDP_SHARDING_STRATEGY", "1", "give the name, not a number", "stage 2 = SHARD_GRAD_OP"},
      {"EMBER_FSDP_AUTO_WRAP_POLICY", "BY_SIZE", "TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP, NO_WRAP"},
      {"EMBER_FSDP_MIN_NUM_PARAMS", "1e8", "positive integer"},
      {"EMBER_FSDP_MIN_NUM_PARAMS", "0", "positive integer"},
      {"EMBER_FSDP_MIN_NUM_PARAMS", "-5", "positive integer"},
      {"EMBER_FSDP_RESHARD_AFTER_FORWARD", "sometimes", "true, false, 1, 0"},
      {"EMBER_FSDP_FORWARD_PREFETCH", "2", "true, false, 1, 0"},
      {"EMBER_FSDP_BACKWARD_PREFETCH", "BACKWARD_POST", "BACKWARD_PRE, NO_PREFETCH"},
      {"EMBER_FSDP_ACTIVATION_CHECKPOINTING", "on", "true, false, 1, 0"},
      {"EMBER_FSDP_STATE_DICT_TYPE", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT, FULL_STATE_DICT"},
      {"EMBER_FSDP_REDUCE_DTYPE", "float16", "f32, bf16, f16"},
      {"EMBER_FSDP_OFFLOAD_PARAMS", "true", "not supported"},
      {"EMBER_FSDP_CPU_OFFLOAD", "1", "not supported"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c[0] + "=" + c[1]);
    set(c[0], c[1]);
    try {
      fsdp_options_from_env();
      ADD_FAILURE() << "expected ember::Error";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(c[0] + "='" + c[1] + "'"), std::string::npos) << message;
      for (size_t i = 2; i < c.size(); ++i) EXPECT_NE(message.find(c[i]), std::string::npos) << c[i] << " in " << message;
    }
    ::unsetenv(c[0].c_str());
  }
}

TEST_F(FSDPEnvTest, WhatTheLauncherSetsReadsBack) {
  FSDPOptions o;
  o.sharding_strategy = ShardingStrategy::SHARD_OPTIMIZER;
  o.transformer_layer_cls_to_wrap = {"BertLayer", "Pooler"};
  o.reshard_after_forward = true;
  o.backward_prefetch = BackwardPrefetch::NO_PREFETCH;
  o.activation_checkpointing = true;
  o.mixed_precision.reduce_dtype = DType::f16;
  const auto variables = fsdp_env(o);
  ASSERT_FALSE(variables.empty());
  EXPECT_EQ(variables.front(), (std::pair<std::string, std::string>{"EMBER_USE_FSDP", "true"}));
  std::map<std::string, std::string> by_name(variables.begin(), variables.end());
  EXPECT_EQ(by_name["EMBER_FSDP_SHARDING_STRATEGY"], "SHARD_OPTIMIZER");
  EXPECT_EQ(by_name["EMBER_FSDP_TRANSFORMER_CLS_TO_WRAP"], "BertLayer,Pooler");
  EXPECT_EQ(by_name.count("EMBER_FSDP_OFFLOAD_PARAMS"), 0u);  // left to its default

  set_all(variables);
  ember::testing::expect_same_fsdp_options(*fsdp_options_from_env(), o);
}

TEST(FSDPSettings, OptionsNoFileCouldHoldAreRefused) {
  FSDPOptions o;
  EXPECT_NO_THROW(check_fsdp_options(o, "here"));
  o.min_num_params = 0;
  EXPECT_EMBER_ERROR(check_fsdp_options(o, "here"), "here", "fsdp_min_num_params", "positive");
  o = FSDPOptions{};
  o.cpu_offload = true;
  EXPECT_EMBER_ERROR(check_fsdp_options(o, "here"), "fsdp_offload_params", "not supported");
  // Accelerate's names: the YAML key and the variable differ for the wrapped classes only.
  for (const FSDPSetting& setting : fsdp_settings()) {
    const std::string key = setting.key, variable = setting.variable;
    if (key == "fsdp_transformer_layer_cls_to_wrap") {
      EXPECT_EQ(variable, "EMBER_FSDP_TRANSFORMER_CLS_TO_WRAP");
      continue;
    }
    std::string expected = "EMBER_" + key;
    for (char& c : expected) c = char(std::toupper(static_cast<unsigned char>(c)));
    EXPECT_EQ(variable, expected);
  }
}

}  // namespace
}  // namespace ember::distributed
