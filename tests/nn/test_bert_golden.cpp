// BERT against PyTorch + Hugging Face transformers: checkpoints saved by transformers load here
// and give the same logits, loss, gradients and AdamW trajectory on a padded batch; checkpoints
// saved here reload identically and carry transformers' key names. The golden files come from
// tests/golden/make_bert_golden.py (see tests/golden/README.md); no Python is needed to run this.
//
// Tolerances: the generating script checks that its float32 values agree with a float64 run to
// 1e-5 of each tensor's largest magnitude, so float32 rounding stays well inside the 1e-4 used here
// (kTol). The loading and comparison helpers are shared with the GPU twin
// (tests/support/bert_golden_support.h).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <sstream>
#include <type_traits>

#include "bert_golden_support.h"
#include "nn/io/safetensors.h"
#include "nn/models/pretrained.h"
#include "optim/sgd_adam.h"
#include "test_util.h"

using namespace ember;
using namespace ember::nn;
using ember::testing::TempDir;
namespace fs = std::filesystem;

namespace {

using namespace ember::testing::bert_golden;

float scalar(const Tensor& t) { return t.item<float>(); }

template <typename M>
class BertGolden : public ::testing::Test {
 protected:
  std::string kind() const { return Kind<M>::name; }
  std::string checkpoint() const { return golden_dir() + "/" + kind(); }
  std::shared_ptr<M> load() const { return from_pretrained<M>(checkpoint()); }
};

using Models = ::testing::Types<BertForMaskedLM, BertForSequenceClassification>;
TYPED_TEST_SUITE(BertGolden, Models, ModelNames);

TYPED_TEST(BertGolden, LoadsTransformersCheckpointCompletely) {
  const BertConfig cfg = BertConfig::from_json_file(this->checkpoint() + "/config.json");
  EXPECT_EQ(cfg.vocab_size, 512);
  EXPECT_EQ(cfg.hidden_size, 32);
  EXPECT_EQ(cfg.num_hidden_layers, 2);
  EXPECT_EQ(cfg.num_attention_heads, 4);
  EXPECT_EQ(cfg.intermediate_size, 64);
  EXPECT_EQ(cfg.max_position_embeddings, 64);
  EXPECT_EQ(cfg.hidden_act, "gelu");
  EXPECT_EQ(cfg.hidden_dropout_prob, 0.0);
  EXPECT_EQ(cfg.layer_norm_eps, 1e-12);
  EXPECT_EQ(cfg.num_labels, 2);
  TypeParam model(cfg);
  const LoadReport r = load_pretrained_weights(model, this->checkpoint());
  EXPECT_TRUE(r.unexpected_keys.empty()) << r.str();
  // transformers stores the tied decoder once, as the word embeddings and cls.predictions.bias.
  for (const auto& k : r.missing_keys)
    EXPECT_TRUE(k == "cls.predictions.decoder.weight" || k == "cls.predictions.decoder.bias") << "missing " << k;
  // Every stored tensor was copied in.
  for (const auto& [name, value] : load_safetensors(this->checkpoint() + "/model.safetensors"))
    EXPECT_TRUE(close_to_golden(name, model.state_dict().at(name), value, 0.0));
}

TYPED_TEST(BertGolden, ForwardMatchesTransformers) {
  const Golden g(this->kind());
  auto model = this->load();
  model->eval();
  ModelOutput out = run(*model, g);
  EXPECT_TRUE(close_to_golden("logits", out.logits, g.at("logits")));
  EXPECT_TRUE(close_to_golden("loss", out.loss, g.at("loss")));
  // Training mode (dropout probabilities are 0) and no labels give the same logits.
  model->train();
  EXPECT_TRUE(close_to_golden("logits (train mode)", run(*model, g, false).logits, g.at("logits")));
  EXPECT_FALSE(run(*model, g, false).loss.defined());
}

TYPED_TEST(BertGolden, GradientsMatchTransformers) {
  const Golden g(this->kind());
  auto model = this->load();
  ModelOutput out = run(*model, g);
  out.loss.backward();
  expect_gradients_match(*model, g, Device::cpu(), kTol, "grad ", /*key_bias_is_noise=*/true);
}

// Under bf16 autocast (products in bf16, normalisation and loss in f32) the same model stays
// near the float32 goldens (observed: 7e-3 of each tensor's largest magnitude at worst; the
// tolerances leave a factor of 3 to 4 for 8-bit mantissas through two layers).
TYPED_TEST(BertGolden, Bf16AutocastStaysNearTransformers) {
  const Golden g(this->kind());
  auto model = this->load();
  ModelOutput out;
  {
    AutocastGuard autocast(DeviceType::CPU, DType::bf16);
    out = run(*model, g);
  }
  EXPECT_EQ(out.loss.dtype(), DType::f32);
  EXPECT_TRUE(close_to_golden("bf16 logits", out.logits.to(DType::f32), g.at("logits"), 2e-2));
  EXPECT_TRUE(close_to_golden("bf16 loss", out.loss, g.at("loss"), 1e-2));
  out.loss.backward();
  expect_gradients_match(*model, g, Device::cpu(), 3e-2, "bf16 grad ", /*key_bias_is_noise=*/false);
}

TYPED_TEST(BertGolden, AdamWStepsMatchTransformers) {
  const Golden g(this->kind());
  auto model = this->load();
  optim::AdamW opt(model->parameters(), {.lr = 1e-3, .weight_decay = 0.01});
  std::vector<float> losses;
  for (int step = 0; step < kAdamWSteps; ++step) {
    opt.zero_grad();
    Tensor loss = run(*model, g).loss;
    losses.push_back(scalar(loss));
    loss.backward();
    opt.step();
  }
  EXPECT_TRUE(close_to_golden("losses before each step", from_vector(losses, {kAdamWSteps}), g.at("adamw_losses")));
  const auto params = g.with_prefix("adamw.");
  EXPECT_GE(params.size(), 6u);
  for (const auto& [name, expected] : params) {
    // The step must have moved the parameter well beyond the tolerance for this to test anything.
    const Tensor before = load_safetensors(this->checkpoint() + "/model.safetensors").at(name);
    EXPECT_FALSE(close_to_golden(name, before, expected)) << name << " barely moved";
    EXPECT_TRUE(close_to_golden("after AdamW " + name, model->parameter(name), expected));
  }
  if constexpr (std::is_same_v<TypeParam, BertForMaskedLM>) {
    // The tied decoder followed the word embeddings.
    EXPECT_TRUE(close_to_golden("decoder weight", model->decoder_weight,
                                g.at("adamw.bert.embeddings.word_embeddings.weight")));
  }
}

TYPED_TEST(BertGolden, SavePretrainedReloadsIdenticallyWithTransformersKeys) {
  const Golden g(this->kind());
  auto model = this->load();
  model->eval();
  TempDir dir{"ember_bert_golden"};
  save_pretrained(*model, model->config, dir.path(), Kind<TypeParam>::architecture);
  auto reloaded = from_pretrained<TypeParam>(dir.path());
  reloaded->eval();
  const Tensor a = run(*model, g).logits, b = run(*reloaded, g).logits;
  EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
  EXPECT_EQ(scalar(run(*model, g).loss), scalar(run(*reloaded, g).loss));
  // Same tensor names, shapes and dtypes as the checkpoint transformers wrote.
  const auto ours = read_safetensors_header(dir.path() + "/model.safetensors").tensors;
  const auto theirs = read_safetensors_header(this->checkpoint() + "/model.safetensors").tensors;
  std::set<std::string> our_keys, their_keys;
  for (const auto& [k, e] : ours) our_keys.insert(k);
  for (const auto& [k, e] : theirs) their_keys.insert(k);
  EXPECT_EQ(our_keys, their_keys);
  for (const auto& [k, e] : theirs) {
    if (!ours.count(k)) continue;
    EXPECT_EQ(ours.at(k).shape, e.shape) << k;
    EXPECT_EQ(ours.at(k).dtype, e.dtype) << k;
  }
  const BertConfig cfg = BertConfig::from_json_file(dir.path() + "/config.json");
  EXPECT_EQ(cfg.architectures, std::vector<std::string>{Kind<TypeParam>::architecture});
  EXPECT_EQ(cfg.num_labels, model->config.num_labels);
  EXPECT_EQ(cfg.layer_norm_eps, model->config.layer_norm_eps);
}

// Writes, after the AdamW steps (so the weights differ from the golden checkpoint), an Ember
// checkpoint and Ember's logits for make_bert_golden.py --verify to check in transformers. Writes
// into $EMBER_BERT_EXPORT_DIR/<kind> when set, else into a scratch directory.
TYPED_TEST(BertGolden, ExportForPythonVerify) {
  TempDir scratch{"ember_bert_golden"};
  const char* env = std::getenv("EMBER_BERT_EXPORT_DIR");
  const std::string out = (env && *env ? std::string(env) : scratch.path()) + "/" + this->kind();
  const Golden g(this->kind());
  auto model = this->load();
  optim::AdamW opt(model->parameters(), {.lr = 1e-3, .weight_decay = 0.01});
  for (int step = 0; step < kAdamWSteps; ++step) {
    opt.zero_grad();
    run(*model, g).loss.backward();
    opt.step();
  }
  model->eval();
  save_pretrained(*model, model->config, out, Kind<TypeParam>::architecture);
  const Tensor logits = run(*model, g, false).logits;
  save_safetensors(out + "/ember_outputs.safetensors",
                   {{"input_ids", g.at("input_ids")},
                    {"attention_mask", g.at("attention_mask")},
                    {"token_type_ids", g.at("token_type_ids")},
                    {"logits", logits}});
  EXPECT_TRUE(fs::exists(out + "/config.json"));
  EXPECT_FALSE(close_to_golden("logits after training", logits, g.at("logits")))
      << "training should have changed the logits";
}

// The sparse prediction head scores only labelled positions: same loss, and each logits row is
// the full head's row at that position.
TEST(BertGoldenSparse, SparsePredictionMatchesDenseHead) {
  const Golden g("mlm");
  auto model = from_pretrained<BertForMaskedLM>(golden_dir() + "/mlm");
  model->eval();
  model->sparse_prediction = true;
  ModelOutput out = run(*model, g);
  EXPECT_TRUE(close_to_golden("loss", out.loss, g.at("loss")));
  const std::vector<int64_t> labels = g.at("labels").to_vector<int64_t>();
  std::vector<int64_t> rows;
  for (size_t i = 0; i < labels.size(); ++i)
    if (labels[i] != -100) rows.push_back(int64_t(i));
  ASSERT_EQ(out.logits.size(0), int64_t(rows.size()));
  const Tensor full = g.at("logits").reshape({-1, 512});
  const Tensor picked = index_select(full, 0, from_vector(rows, {int64_t(rows.size())}));
  EXPECT_TRUE(close_to_golden("sparse logits", out.logits, picked));
}

}  // namespace
