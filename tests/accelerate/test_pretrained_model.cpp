// nn::PretrainedModel and Accelerator::save_model: a model implementing the interface is saved
// through its save_pretrained (config.json naming its architecture, plus its weights), whatever
// its type; any other model as plain safetensors of its state dict.
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "ember/accelerate.h"
#include "small_bert.h"
#include "test_util.h"

using namespace ember;
using namespace ember::distributed;
namespace fs = std::filesystem;

namespace {

// A model that is not BERT: one Linear and a width in its config.
class TinyRegressor : public nn::PretrainedModel {
 public:
  explicit TinyRegressor(int64_t in_features) : PretrainedModel("TinyRegressor"), width(in_features) {
    fc = register_module("fc", std::make_shared<nn::Linear>(in_features, 2));
  }
  Tensor forward(const Tensor& x) override { return fc->forward(x); }
  nn::JsonConfig config_json() const override {
    nn::JsonConfig config;
    config.set("model_type", std::string("tiny"));
    config.set("width", width);
    return config;
  }
  int64_t width;
  std::shared_ptr<nn::Linear> fc;
};

// Names its own architecture, ties a weight between two children and writes one more file.
class TiedPair : public nn::PretrainedModel {
 public:
  TiedPair() : PretrainedModel("TiedPair") {
    first = register_module("first", std::make_shared<nn::Linear>(3, 3));
    second = register_module("second", std::make_shared<TiedWeight>(first->weight));
  }
  std::string architecture() const override { return "TiedPairForTests"; }
  nn::JsonConfig config_json() const override { return nn::JsonConfig(); }
  void save_pretrained(const std::string& dir, const nn::SavePretrainedOptions& options = {}) const override {
    PretrainedModel::save_pretrained(dir, options);
    if (options.is_main_process) std::ofstream(dir + "/extra.txt") << "written by TiedPair";
  }

  class TiedWeight : public nn::Module {
   public:
    explicit TiedWeight(const Tensor& w) : Module("TiedWeight") { register_parameter("weight", w); }
  };
  std::shared_ptr<nn::Linear> first;
  std::shared_ptr<TiedWeight> second;
};

class PlainModel : public nn::Module {
 public:
  PlainModel() : Module("PlainModel") { fc = register_module("fc", std::make_shared<nn::Linear>(2, 2)); }
  std::shared_ptr<nn::Linear> fc;
};

std::vector<std::string> keys(const std::map<std::string, Tensor>& tensors) {
  std::vector<std::string> out;
  for (const auto& [name, t] : tensors) out.push_back(name);
  return out;
}

nn::BertConfig small_bert_config() { return ember::testing::one_layer_bert_config(64); }

}  // namespace

TEST(PretrainedModel, SaveModelWritesACustomModelThroughTheInterface) {
  ember::testing::TempDir dir("accel_pretrained_custom");
  Accelerator acc;
  auto model = std::make_shared<TinyRegressor>(3);
  auto prepared = acc.prepare(model);
  std::shared_ptr<nn::Module> base = model;
  acc.save_model(prepared, dir.file("handle"));
  acc.save_model(base, dir.file("base"));  // found by its dynamic type, not the static one
  for (const char* form : {"handle", "base"}) {
    const std::string out = dir.file(form);
    const nn::JsonConfig config = nn::JsonConfig::load(out + "/config.json");
    EXPECT_EQ(config.get<std::vector<std::string>>("architectures"), (std::vector<std::string>{"TinyRegressor"}))
        << form;
    EXPECT_EQ(config.get<int64_t>("width"), 3) << form;
    EXPECT_EQ(config.get<std::string>("model_type"), "tiny") << form;
    const auto weights = nn::load_safetensors(out + "/model.safetensors");
    EXPECT_EQ(keys(weights), (std::vector<std::string>{"fc.bias", "fc.weight"})) << form;
    EXPECT_TRUE(ember::testing::all_close(weights.at("fc.weight"), model->fc->weight, 0, 0)) << form;
    EXPECT_TRUE(ember::testing::all_close(weights.at("fc.bias"), model->fc->bias, 0, 0)) << form;
  }
}

TEST(PretrainedModel, SaveModelCallsTheModelsOwnSavePretrainedAndArchitecture) {
  ember::testing::TempDir dir("accel_pretrained_override");
  Accelerator acc;
  TiedPair model;
  acc.save_model(model, dir.file("pair"));
  EXPECT_TRUE(fs::exists(dir.file("pair/extra.txt")));
  EXPECT_EQ(nn::JsonConfig::load(dir.file("pair/config.json")).get<std::vector<std::string>>("architectures"),
            (std::vector<std::string>{"TiedPairForTests"}));
  // The tied weight once, under its first name, as transformers writes it.
  const auto weights = nn::load_safetensors(dir.file("pair/model.safetensors"));
  EXPECT_EQ(keys(weights), (std::vector<std::string>{"first.bias", "first.weight"}));
}

TEST(PretrainedModel, OptionsReachTheInterfacesSavePretrained) {
  ember::testing::TempDir dir("accel_pretrained_options");
  TinyRegressor model(4);
  model.save_pretrained(dir.file("other"), {.is_main_process = false});
  EXPECT_FALSE(fs::exists(dir.file("other")));
  int calls = 0;
  auto counting = [&](const nn::StateDict& weights, const std::string& path) {
    ++calls;
    EXPECT_EQ(keys(weights), (std::vector<std::string>{"fc.bias", "fc.weight"}));
    EXPECT_EQ(path, dir.file("counted") + "/model.safetensors");
  };
  model.save_pretrained(dir.file("counted"), {.save_function = counting});
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(nn::JsonConfig::load(dir.file("counted/config.json")).get<int64_t>("width"), 4);
  EXPECT_FALSE(fs::exists(dir.file("counted/model.safetensors")));  // the function chose not to write
}

TEST(PretrainedModel, AModelWithoutTheInterfaceIsSavedAsPlainSafetensors) {
  ember::testing::TempDir dir("accel_pretrained_plain");
  Accelerator acc;
  PlainModel model;
  acc.save_model(model, dir.file("plain"));
  EXPECT_FALSE(fs::exists(dir.file("plain/config.json")));
  const auto weights = nn::load_safetensors(dir.file("plain/model.safetensors"));
  EXPECT_EQ(keys(weights), (std::vector<std::string>{"fc.bias", "fc.weight"}));
  EXPECT_TRUE(ember::testing::all_close(weights.at("fc.weight"), model.fc->weight, 0, 0));
}

TEST(PretrainedModel, EveryBertModelSavesThroughTheInterfaceUnderItsArchitecture) {
  ember::testing::TempDir dir("accel_pretrained_bert");
  Accelerator acc;
  const nn::BertConfig cfg = small_bert_config();
  std::vector<std::pair<std::string, std::shared_ptr<nn::Module>>> models{
      {"BertModel", std::make_shared<nn::BertModel>(cfg)},
      {"BertForMaskedLM", std::make_shared<nn::BertForMaskedLM>(cfg)},
      {"BertForSequenceClassification", std::make_shared<nn::BertForSequenceClassification>(cfg)}};
  for (const auto& [architecture, model] : models) {
    EXPECT_NE(dynamic_cast<const nn::PretrainedModel*>(model.get()), nullptr) << architecture;
    acc.save_model(model, dir.file(architecture));
    const nn::BertConfig saved = nn::BertConfig::from_json_file(dir.file(architecture + "/config.json"));
    EXPECT_EQ(saved.architectures, (std::vector<std::string>{architecture}));
    EXPECT_EQ(saved.hidden_size, cfg.hidden_size) << architecture;
    const auto weights = nn::load_safetensors(dir.file(architecture + "/model.safetensors"));
    EXPECT_TRUE(ember::testing::all_close(weights.at(architecture == "BertModel"
                                                         ? "embeddings.word_embeddings.weight"
                                                         : "bert.embeddings.word_embeddings.weight"),
                                          model->parameters().front(), 0, 0))
        << architecture;
  }
}
