// ResNet against PyTorch + Hugging Face transformers' ResNetForImageClassification: the
// checkpoints transformers saved load here and give the same train-mode logits, loss, gradients
// and batch-norm running statistics, the same AdamW trajectory (running statistics included)
// and the same eval-mode logits afterwards; checkpoints saved here reload with transformers'
// names. Golden files: tests/golden/make_resnet_golden.py (see tests/golden/README.md).
//
// Tolerance: the script checks that its float32 values agree with a float64 run to 1e-5 of each
// tensor's largest magnitude (observed 3e-6), so kTol measures Ember.
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "bert_golden_support.h"
#include "core/grad_mode.h"
#include "distributed/sync_batch_norm.h"
#include "nn/io/safetensors.h"
#include "nn/models/resnet.h"
#include "optim/sgd_adam.h"
#include "test_util.h"

using namespace ember;
using namespace ember::nn;
using ember::testing::TempDir;
using ember::testing::bert_golden::close_to_golden;
using ember::testing::bert_golden::Golden;
namespace fs = std::filesystem;

namespace {

constexpr double kTol = 1e-5;
constexpr int kAdamWSteps = 3;
const std::string kGoldenDir = std::string(EMBER_SOURCE_DIR) + "/tests/golden/resnet";

class ResNetGolden : public ::testing::TestWithParam<std::string> {
 protected:
  std::string checkpoint() const { return kGoldenDir + "/" + GetParam(); }
  const Golden& golden() const {
    static std::map<std::string, Golden> cache;
    auto it = cache.find(GetParam());
    if (it == cache.end()) it = cache.emplace(GetParam(), Golden(kGoldenDir, GetParam())).first;
    return it->second;
  }
  ImageClassifierOutput run(ResNetForImageClassification& m) const {
    return m.forward(golden().at("pixel_values"), golden().at("labels"));
  }
};

}  // namespace

TEST_P(ResNetGolden, LoadsTransformersCheckpointCompletely) {
  const ResNetConfig cfg = ResNetConfig::from_json_file(checkpoint() + "/config.json");
  EXPECT_EQ(cfg.layer_type, GetParam());
  EXPECT_EQ(cfg.architectures, std::vector<std::string>{"ResNetForImageClassification"});
  ResNetForImageClassification model(cfg);
  const LoadReport r = load_resnet_weights(model, checkpoint());
  EXPECT_TRUE(r.ok()) << r.str();
  for (const auto& [name, value] : load_safetensors(checkpoint() + "/model.safetensors"))
    EXPECT_TRUE(close_to_golden(name, model.state_dict().at(name), value, 0.0));
}

TEST_P(ResNetGolden, TrainForwardGradientsAndRunningStatsMatchTransformers) {
  auto model = ResNetForImageClassification::from_pretrained(checkpoint());
  model->train();
  const ImageClassifierOutput out = run(*model);
  EXPECT_TRUE(close_to_golden("logits", out.logits, golden().at("logits"), kTol));
  EXPECT_TRUE(close_to_golden("loss", out.loss, golden().at("loss"), kTol));
  out.loss.backward();
  const auto grads = golden().with_prefix("grad.");
  EXPECT_EQ(grads.size(), model->named_parameters().size()) << "one golden gradient per parameter";
  for (const auto& [name, expected] : grads) {
    const Tensor grad = model->parameter(name).grad();
    ASSERT_TRUE(grad.defined()) << name;
    EXPECT_TRUE(close_to_golden("grad " + name, grad, expected, kTol));
  }
  const auto stats = golden().with_prefix("after_forward.");
  EXPECT_FALSE(stats.empty());
  const StateDict sd = model->state_dict();
  for (const auto& [name, expected] : stats) EXPECT_TRUE(close_to_golden(name, sd.at(name), expected, kTol));
  EXPECT_EQ(sd.at("resnet.embedder.embedder.normalization.num_batches_tracked").item<int64_t>(), 1);
}

TEST_P(ResNetGolden, AdamWStepsAndEvalLogitsMatchTransformers) {
  auto model = ResNetForImageClassification::from_pretrained(checkpoint());
  optim::AdamW opt(model->parameters(), {.lr = 1e-3, .eps = 1e-3, .weight_decay = 0.01});
  run(*model);  // the script's gradient pass: one more training forward for the running statistics
  std::vector<float> losses;
  for (int step = 0; step < kAdamWSteps; ++step) {
    opt.zero_grad();
    Tensor loss = run(*model).loss;
    losses.push_back(loss.item<float>());
    loss.backward();
    opt.step();
  }
  EXPECT_TRUE(close_to_golden("losses before each step", from_vector(losses, {kAdamWSteps}),
                              golden().at("adamw_losses"), kTol));
  const StateDict sd = model->state_dict();
  const auto after = golden().with_prefix("adamw.");
  EXPECT_EQ(after.size(), model->named_parameters().size() + 2 * (sd.size() - model->named_parameters().size()) / 3)
      << "every parameter and every floating buffer";
  for (const auto& [name, expected] : after) EXPECT_TRUE(close_to_golden("after AdamW " + name, sd.at(name), expected, kTol));
  model->eval();
  NoGradGuard no_grad;
  EXPECT_TRUE(close_to_golden("eval logits", model->forward(golden().at("pixel_values"), Tensor()).logits,
                              golden().at("eval_logits"), kTol));
}

TEST_P(ResNetGolden, SavePretrainedReloadsWithTransformersKeys) {
  auto model = ResNetForImageClassification::from_pretrained(checkpoint());
  model->eval();
  TempDir dir{"ember_resnet_golden"};
  model->save_pretrained(dir.path());
  auto reloaded = ResNetForImageClassification::from_pretrained(dir.path());
  reloaded->eval();
  NoGradGuard no_grad;
  const Tensor x = golden().at("pixel_values");
  EXPECT_EQ(model->forward(x).to_vector<float>(), reloaded->forward(x).to_vector<float>());
  std::set<std::string> ours, theirs;
  for (const auto& [k, e] : read_safetensors_header(dir.path() + "/model.safetensors").tensors) ours.insert(k);
  for (const auto& [k, e] : read_safetensors_header(checkpoint() + "/model.safetensors").tensors) theirs.insert(k);
  EXPECT_EQ(ours, theirs);
  // The bare model's checkpoint loads into the classifier (a fresh head) and back.
  TempDir bare{"ember_resnet_bare"};
  model->resnet->save_pretrained(bare.path());
  auto from_bare = ResNetForImageClassification::from_pretrained(bare.path());
  EXPECT_TRUE(close_to_golden("stem after bare round trip", from_bare->resnet->embedder->embedder->convolution->weight,
                              model->resnet->embedder->embedder->convolution->weight, 0.0));
}

// convert_sync_batchnorm reaches the batch norms the ResNet layers call through members; in one
// process the converted model computes exactly what the original does.
TEST_P(ResNetGolden, ConvertsToSyncBatchNormAndStillMatches) {
  auto model = ResNetForImageClassification::from_pretrained(checkpoint());
  auto converted = std::dynamic_pointer_cast<ResNetForImageClassification>(nn::convert_sync_batchnorm(model));
  ASSERT_TRUE(converted);
  int synced = 0;
  for (const auto& [name, m] : converted->named_modules()) synced += m->type_name() == "SyncBatchNorm";
  EXPECT_GT(synced, 3);
  EXPECT_EQ(converted->resnet->embedder->embedder->normalization->type_name(), "SyncBatchNorm");
  const ImageClassifierOutput out = run(*converted);
  EXPECT_TRUE(close_to_golden("logits after conversion", out.logits, golden().at("logits"), kTol));
}

// Writes Ember's checkpoint after the AdamW steps and its eval-mode logits for
// make_resnet_golden.py --verify: into $EMBER_RESNET_EXPORT_DIR/<kind> when set, else a scratch directory.
TEST_P(ResNetGolden, ExportForPythonVerify) {
  TempDir scratch{"ember_resnet_export"};
  const char* env = std::getenv("EMBER_RESNET_EXPORT_DIR");
  const std::string out = (env && *env ? std::string(env) : scratch.path()) + "/" + GetParam();
  auto model = ResNetForImageClassification::from_pretrained(checkpoint());
  optim::AdamW opt(model->parameters(), {.lr = 1e-3, .weight_decay = 0.01});
  for (int step = 0; step < kAdamWSteps; ++step) {
    opt.zero_grad();
    run(*model).loss.backward();
    opt.step();
  }
  model->eval();
  model->save_pretrained(out);
  NoGradGuard no_grad;
  const Tensor logits = model->forward(golden().at("pixel_values"));
  save_safetensors(out + "/ember_outputs.safetensors",
                   {{"pixel_values", golden().at("pixel_values")}, {"logits", logits}});
  EXPECT_TRUE(fs::exists(out + "/config.json"));
}

INSTANTIATE_TEST_SUITE_P(Blocks, ResNetGolden, ::testing::Values("basic", "bottleneck"));

TEST(ResNetConfig, ReadsTransformersFieldsAndNamesBadOnes) {
  const ResNetConfig c = ResNetConfig::from_json_string(
      R"({"model_type": "resnet", "num_channels": 1, "embedding_size": 16, "hidden_sizes": [16, 32],
          "depths": [1, 1], "layer_type": "basic", "num_labels": 10})", "a/config.json");
  EXPECT_EQ(c.num_labels, 10);
  const ResNetConfig back = ResNetConfig::from_json_string(c.to_json_string());
  EXPECT_EQ(back.hidden_sizes, c.hidden_sizes);
  EXPECT_EQ(back.num_labels, 10);
  EXPECT_EMBER_ERROR(ResNetConfig::from_json_string(R"({"hidden_sizes": [8, 16], "depths": [1]})", "b/config.json"),
                     "b/config.json", "depths has 1 entries", "hidden_sizes has 2");
  EXPECT_EMBER_ERROR(ResNetConfig::from_json_string(R"({"layer_type": "dense"})", "c/config.json"), "c/config.json",
                     "layer_type 'dense'");
  EXPECT_EMBER_ERROR(ResNetConfig::from_json_string(R"({"hidden_sizes": [6], "depths": [1]})", "d/config.json"),
                     "multiple of 4");
  EXPECT_EMBER_ERROR(ResNetConfig::from_json_string(R"({"model_type": "bert"})", "e/config.json"), "expected 'resnet'");
  EXPECT_EMBER_ERROR(ResNetConfig::from_json_string(R"({"embedding_size": -3})", "f/config.json"), "embedding_size");
  ResNetForImageClassification model(ResNetConfig::small_grey());
  EXPECT_EMBER_ERROR(model.forward(zeros({2, 3, 28, 28})), "pixel_values must be [N, 1, H, W]");
}
