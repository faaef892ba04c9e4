// GPT-2 against PyTorch + Hugging Face transformers: the checkpoint transformers saved loads here
// and gives the same logits, loss, gradients and AdamW trajectory on a right-padded batch;
// checkpoints saved here reload identically with transformers' key names and shapes (Conv1D
// weights [in, out], no lm_head.weight). Also the config's fields and errors, and generate().
// The golden files come from tests/golden/make_gpt2_golden.py (see tests/golden/README.md); no
// Python is needed to run this.
//
// Tolerance: the generating script checks that its float32 values agree with a float64 run to
// 1e-5 of each tensor's largest magnitude (observed 6e-7), so kTol measures Ember.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "bert_golden_support.h"
#include "core/autocast.h"
#include "core/grad_mode.h"
#include "nn/io/safetensors.h"
#include "nn/models/gpt2.h"
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
const std::string kGoldenDir = std::string(EMBER_SOURCE_DIR) + "/tests/golden";
const std::string kCheckpoint = kGoldenDir + "/gpt2";

const Golden& golden() {
  static const Golden g(kGoldenDir, "gpt2");
  return g;
}

CausalLMOutput run(GPT2LMHeadModel& m, bool with_labels = true) {
  const Golden& g = golden();
  return m.forward(g.at("input_ids"), g.at("attention_mask"), with_labels ? g.at("labels") : Tensor());
}

double max_abs(const Tensor& t) { return t.abs().max().item<double>(); }

// Every parameter's gradient against transformers'. The key third of each c_attn bias has a zero
// gradient in exact arithmetic (softmax ignores a shift shared by every key): only its size is
// checked.
void expect_gradients_match(const GPT2LMHeadModel& model, double tol, const std::string& label) {
  const auto grads = golden().with_prefix("grad.");
  EXPECT_EQ(grads.size(), model.named_parameters().size()) << "one golden gradient per parameter";
  for (const auto& [name, expected] : grads) {
    const Tensor grad = model.parameter(name).grad();
    ASSERT_TRUE(grad.defined()) << name;
    if (name.size() > 11 && name.compare(name.size() - 11, 11, "c_attn.bias") == 0) {
      const int64_t e = grad.size(0) / 3;
      EXPECT_TRUE(close_to_golden(label + name + " (query third)", grad.narrow(0, 0, e), expected.narrow(0, 0, e), tol));
      EXPECT_TRUE(
          close_to_golden(label + name + " (value third)", grad.narrow(0, 2 * e, e), expected.narrow(0, 2 * e, e), tol));
      EXPECT_LT(max_abs(grad.narrow(0, e, e)), 1e-6) << name << " key third should be rounding noise";
      continue;
    }
    EXPECT_TRUE(close_to_golden(label + name, grad, expected, tol));
  }
}

}  // namespace

TEST(GPT2Golden, LoadsTransformersCheckpointCompletely) {
  const GPT2Config cfg = GPT2Config::from_json_file(kCheckpoint + "/config.json");
  EXPECT_EQ(cfg.vocab_size, 96);
  EXPECT_EQ(cfg.n_positions, 16);
  EXPECT_EQ(cfg.n_embd, 16);
  EXPECT_EQ(cfg.n_layer, 2);
  EXPECT_EQ(cfg.n_head, 2);
  EXPECT_FALSE(cfg.n_inner.has_value());
  EXPECT_EQ(cfg.inner_size(), 64);
  EXPECT_EQ(cfg.activation_function, "gelu_new");
  EXPECT_EQ(cfg.layer_norm_epsilon, 1e-5);
  EXPECT_EQ(cfg.bos_token_id, 95);
  EXPECT_EQ(cfg.architectures, std::vector<std::string>{"GPT2LMHeadModel"});
  GPT2LMHeadModel model(cfg);
  const LoadReport r = load_gpt2_weights(model, kCheckpoint);
  EXPECT_TRUE(r.unexpected_keys.empty()) << r.str();
  EXPECT_EQ(r.missing_keys, std::vector<std::string>{"lm_head.weight"});
  for (const auto& [name, value] : load_safetensors(kCheckpoint + "/model.safetensors"))
    EXPECT_TRUE(close_to_golden(name, model.state_dict().at(name), value, 0.0));
  // the head reads the embeddings themselves
  EXPECT_EQ(model.lm_head->weight.impl()->storage, model.transformer->wte->weight.impl()->storage);
}

TEST(GPT2Golden, ForwardMatchesTransformers) {
  auto model = GPT2LMHeadModel::from_pretrained(kCheckpoint);
  model->eval();
  const CausalLMOutput out = run(*model);
  EXPECT_TRUE(close_to_golden("logits", out.logits, golden().at("logits"), kTol));
  EXPECT_TRUE(close_to_golden("loss", out.loss, golden().at("loss"), kTol));
  model->train();  // dropout probabilities are 0
  EXPECT_TRUE(close_to_golden("logits (train mode)", run(*model, false).logits, golden().at("logits"), kTol));
  EXPECT_FALSE(run(*model, false).loss.defined());
}

// Without padding the causal path needs no mask tensor: rows of the golden batch that are not
// padded give the same logits alone, with an all-ones mask and with no mask.
TEST(GPT2Golden, UnpaddedRowNeedsNoMask) {
  auto model = GPT2LMHeadModel::from_pretrained(kCheckpoint);
  model->eval();
  const Tensor ids = golden().at("input_ids").narrow(0, 0, 1);  // the full-length row
  const Tensor want = golden().at("logits").narrow(0, 0, 1);
  EXPECT_TRUE(close_to_golden("no mask", model->forward(ids).logits, want, kTol));
  EXPECT_TRUE(close_to_golden("ones mask", model->forward(ids, ones_like(ids)).logits, want, kTol));
}

TEST(GPT2Golden, GradientsMatchTransformers) {
  auto model = GPT2LMHeadModel::from_pretrained(kCheckpoint);
  run(*model).loss.backward();
  expect_gradients_match(*model, kTol, "grad ");
}

TEST(GPT2Golden, Bf16AutocastStaysNearTransformers) {
  auto model = GPT2LMHeadModel::from_pretrained(kCheckpoint);
  CausalLMOutput out;
  {
    AutocastGuard autocast(DeviceType::CPU, DType::bf16);
    out = run(*model);
  }
  EXPECT_EQ(out.loss.dtype(), DType::f32);
  EXPECT_TRUE(close_to_golden("bf16 logits", out.logits.to(DType::f32), golden().at("logits"), 3e-2));
  EXPECT_TRUE(close_to_golden("bf16 loss", out.loss, golden().at("loss"), 1e-2));
}

TEST(GPT2Golden, AdamWStepsMatchTransformers) {
  auto model = GPT2LMHeadModel::from_pretrained(kCheckpoint);
  optim::AdamW opt(model->parameters(), {.lr = 1e-3, .weight_decay = 0.01});
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
  const auto params = golden().with_prefix("adamw.");
  EXPECT_GE(params.size(), 6u);
  const auto before = load_safetensors(kCheckpoint + "/model.safetensors");
  for (const auto& [name, expected] : params) {
    EXPECT_FALSE(close_to_golden(name, before.at(name), expected, kTol)) << name << " barely moved";
    EXPECT_TRUE(close_to_golden("after AdamW " + name, model->parameter(name), expected, kTol));
  }
  EXPECT_TRUE(close_to_golden("tied lm_head", model->lm_head->weight, golden().at("adamw.transformer.wte.weight"),
                              kTol));
}

TEST(GPT2Golden, SavePretrainedReloadsIdenticallyWithTransformersKeys) {
  auto model = GPT2LMHeadModel::from_pretrained(kCheckpoint);
  model->eval();
  TempDir dir{"ember_gpt2_golden"};
  model->save_pretrained(dir.path());
  auto reloaded = GPT2LMHeadModel::from_pretrained(dir.path());
  reloaded->eval();
  EXPECT_EQ(run(*model).logits.to_vector<float>(), run(*reloaded).logits.to_vector<float>());
  const auto ours = read_safetensors_header(dir.path() + "/model.safetensors").tensors;
  const auto theirs = read_safetensors_header(kCheckpoint + "/model.safetensors").tensors;
  std::set<std::string> our_keys, their_keys;
  for (const auto& [k, e] : ours) our_keys.insert(k);
  for (const auto& [k, e] : theirs) their_keys.insert(k);
  EXPECT_EQ(our_keys, their_keys);
  EXPECT_EQ(our_keys.count("lm_head.weight"), 0u);
  for (const auto& [k, e] : theirs) {
    if (!ours.count(k)) continue;
    EXPECT_EQ(ours.at(k).shape, e.shape) << k;
    EXPECT_EQ(ours.at(k).dtype, e.dtype) << k;
  }
  const GPT2Config cfg = GPT2Config::from_json_file(dir.path() + "/config.json");
  EXPECT_EQ(cfg.architectures, std::vector<std::string>{"GPT2LMHeadModel"});
  EXPECT_FALSE(cfg.n_inner.has_value());
  EXPECT_EQ(cfg.n_positions, 16);
  // The bare model reads the same files (keys without "transformer.") and the head model reads it back.
  auto bare = GPT2Model::from_pretrained(dir.path());
  TempDir bare_dir{"ember_gpt2_bare"};
  bare->save_pretrained(bare_dir.path());
  EXPECT_EQ(read_safetensors_header(bare_dir.path() + "/model.safetensors").tensors.count("wte.weight"), 1u);
  auto again = GPT2LMHeadModel::from_pretrained(bare_dir.path());
  again->eval();
  EXPECT_EQ(run(*model).logits.to_vector<float>(), run(*again).logits.to_vector<float>());
}

// Writes, after the AdamW steps, an Ember checkpoint and Ember's logits for make_gpt2_golden.py
// --verify to check in transformers: into $EMBER_GPT2_EXPORT_DIR when set, else a scratch directory.
TEST(GPT2Golden, ExportForPythonVerify) {
  TempDir scratch{"ember_gpt2_golden"};
  const char* env = std::getenv("EMBER_GPT2_EXPORT_DIR");
  const std::string out = env && *env ? std::string(env) : scratch.path();
  auto model = GPT2LMHeadModel::from_pretrained(kCheckpoint);
  optim::AdamW opt(model->parameters(), {.lr = 1e-3, .weight_decay = 0.01});
  for (int step = 0; step < kAdamWSteps; ++step) {
    opt.zero_grad();
    run(*model).loss.backward();
    opt.step();
  }
  model->eval();
  model->save_pretrained(out);
  const Tensor logits = run(*model, false).logits;
  save_safetensors(out + "/ember_outputs.safetensors", {{"input_ids", golden().at("input_ids")},
                                                        {"attention_mask", golden().at("attention_mask")},
                                                        {"logits", logits}});
  EXPECT_TRUE(fs::exists(out + "/config.json"));
  EXPECT_FALSE(close_to_golden("logits after training", logits, golden().at("logits"), kTol))
      << "training should have changed the logits";
}

TEST(GPT2Config, ReadsTransformersFieldsAndNamesBadOnes) {
  // config.json text with the given n_head, activation_function and model_type
  auto text = [](int n_head, const std::string& act, const std::string& model_type, const std::string& extra = "") {
    return R"({"model_type": ")" + model_type + R"(", "vocab_size": 50, "n_positions": 8, "n_embd": 12, "n_layer": 1,
              "n_head": )" + std::to_string(n_head) + R"(, "n_inner": 20, "activation_function": ")" + act +
           R"(", "tie_word_embeddings": false, "bos_token_id": null)" + extra + "}";
  };
  const GPT2Config c = GPT2Config::from_json_string(text(3, "relu", "gpt2"), "a/config.json");
  EXPECT_EQ(c.inner_size(), 20);
  EXPECT_EQ(c.activation_function, "relu");
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.bos_token_id.has_value());
  EXPECT_EQ(c.eos_token_id, 50256);  // transformers' default, not checked against vocab_size either
  const GPT2Config back = GPT2Config::from_json_string(c.to_json_string());
  EXPECT_EQ(back.n_inner, c.n_inner);
  EXPECT_EQ(back.tie_word_embeddings, false);
  EXPECT_FALSE(back.bos_token_id.has_value());
  EXPECT_EMBER_ERROR(GPT2Config::from_json_string(text(5, "relu", "gpt2"), "b/config.json"), "b/config.json",
                     "n_embd", "n_head");
  EXPECT_EMBER_ERROR(GPT2Config::from_json_string(text(3, "swiglu", "gpt2"), "c/config.json"), "c/config.json",
                     "activation_function", "swiglu");
  EXPECT_EMBER_ERROR(GPT2Config::from_json_string(text(3, "relu", "bert"), "d/config.json"), "d/config.json",
                     "model_type");
  EXPECT_EMBER_ERROR(GPT2Config::from_json_string(text(3, "relu", "gpt2", R"(, "attn_pdrop": 1.5)"), "e/config.json"),
                     "e/config.json", "attn_pdrop");
  EXPECT_EMBER_ERROR(GPT2Config::from_json_string(text(3, "relu", "gpt2", R"(, "layer_norm_epsilon": -1.0)"),
                                                  "f/config.json"),
                     "f/config.json", "layer_norm_epsilon");
  EXPECT_EMBER_ERROR(GPT2Config::from_json_string(text(0, "relu", "gpt2"), "g/config.json"), "g/config.json", "n_head");
}

// An untied head has its own lm_head.weight, saved and reloaded; transformers' init scales the
// residual projections by 1 / sqrt(2 n_layer).
TEST(GPT2Model, UntiedHeadAndInitialisation) {
  GPT2Config c;
  c.vocab_size = 40;
  c.n_positions = 8;
  c.n_embd = 32;
  c.n_layer = 8;
  c.n_head = 4;
  c.initializer_range = 0.5;
  c.tie_word_embeddings = false;
  manual_seed(3);
  GPT2LMHeadModel model(c);
  EXPECT_NE(model.lm_head->weight.impl()->storage, model.transformer->wte->weight.impl()->storage);
  auto std_of = [](const Tensor& t) {
    const double mean = t.mean().item<double>();
    return std::sqrt(((t - mean) * (t - mean)).mean().item<double>());
  };
  const auto& block = *model.transformer->h->at<GPT2Block>(0);
  EXPECT_NEAR(std_of(block.attn->c_attn->weight), 0.5, 0.05);
  EXPECT_NEAR(std_of(block.mlp->c_proj->weight), 0.5 / 4.0, 0.02);  // sqrt(2 * 8) = 4
  EXPECT_NEAR(std_of(model.lm_head->weight), 0.5, 0.05);
  EXPECT_EQ(block.ln_1->weight.sum().item<double>(), 32.0);
  TempDir dir{"ember_gpt2_untied"};
  model.save_pretrained(dir.path());
  EXPECT_EQ(read_safetensors_header(dir.path() + "/model.safetensors").tensors.count("lm_head.weight"), 1u);
  auto reloaded = GPT2LMHeadModel::from_pretrained(dir.path());
  EXPECT_EQ(reloaded->lm_head->weight.to_vector<float>(), model.lm_head->weight.to_vector<float>());
}

TEST(GPT2Model, BadInputsNameTheShapes) {
  auto model = GPT2LMHeadModel::from_pretrained(kCheckpoint);
  EXPECT_EMBER_ERROR(model->forward(zeros({1, 17}, {DType::i64})), "GPT2Model", "[1, 17]", "n_positions");
  EXPECT_EMBER_ERROR(model->forward(zeros({2, 4}, {DType::i64}), ones({2, 5})), "attention_mask", "[2, 5]", "[2, 4]");
  EXPECT_EMBER_ERROR(model->forward(zeros({2, 4}, {DType::i64}), Tensor(), zeros({2, 3}, {DType::i64})), "labels",
                     "[2, 3]");
}

// top_k = 1 keeps only the likeliest token: sampling equals the greedy loop, whatever the
// temperature. The context slides past n_positions instead of failing.
TEST(GPT2Generate, TopKOneIsGreedyAndTheContextStaysWithinNPositions) {
  auto model = GPT2LMHeadModel::from_pretrained(kCheckpoint);
  const Tensor prompt = golden().at("input_ids").narrow(0, 0, 2).narrow(1, 0, 5).contiguous();
  Generator gen(9);
  const Tensor sampled = model->generate(prompt, {.max_new_tokens = 6, .temperature = 0.7, .top_k = 1, .generator = &gen});
  ASSERT_EQ(sampled.shape(), (Shape{2, 11}));
  EXPECT_EQ(sampled.narrow(1, 0, 5).contiguous().to_vector<int64_t>(), prompt.to_vector<int64_t>());
  Tensor greedy = prompt;
  {
    NoGradGuard ng;
    model->eval();
    for (int step = 0; step < 6; ++step) {
      const Tensor logits = model->forward(greedy).logits;
      const Tensor next = argmax(logits.select(1, greedy.size(1) - 1), -1).view({2, 1});
      greedy = cat({greedy, next}, 1);
    }
  }
  EXPECT_EQ(sampled.to_vector<int64_t>(), greedy.to_vector<int64_t>());
  EXPECT_EQ(model->generate(prompt, {.max_new_tokens = 6, .temperature = 0.0}).to_vector<int64_t>(),
            greedy.to_vector<int64_t>());

  // 5 + 20 tokens > n_positions = 16: the model sees the last 16 only
  const Tensor longer = model->generate(prompt, {.max_new_tokens = 20, .temperature = 1.0, .top_k = 5});
  EXPECT_EQ(longer.shape(), (Shape{2, 25}));
  for (int64_t id : longer.to_vector<int64_t>()) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, 96);
  }
}

TEST(GPT2Generate, SamplingFollowsTheSeededGenerator) {
  auto model = GPT2LMHeadModel::from_pretrained(kCheckpoint);
  const Tensor prompt = golden().at("input_ids").narrow(0, 0, 3).narrow(1, 0, 3).contiguous();
  auto sample = [&](uint64_t seed) {
    Generator gen(seed);
    return model->generate(prompt, {.max_new_tokens = 10, .temperature = 1.5, .top_k = 20, .generator = &gen})
        .to_vector<int64_t>();
  };
  EXPECT_EQ(sample(1), sample(1));
  EXPECT_NE(sample(1), sample(2));
  // no gradient was recorded and the model is back in training mode
  EXPECT_TRUE(model->is_training());
  for (const auto& p : model->parameters()) EXPECT_FALSE(p.grad().defined());
}
