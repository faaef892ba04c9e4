// Whole models on the GPU against the same models on the CPU with identical weights: an MLP
// (linear, gelu, layer_norm, dropout) and a tiny BERT (padded batch, MLM and classification
// heads) give the same loss, the same gradient for every parameter and, after five AdamW
// steps, the same parameters. Dropout draws from the one global generator and its mask is the
// same on both devices for the same generator state, so training mode with p > 0 matches too.
// Also bf16 autocast on CUDA (loss near f32, f32 gradients on f32 parameters) and the fp16
// GradScaler on CUDA (an inf gradient skips the step). Every test skips without a CUDA device.
//
// Tolerances are relative to each tensor's largest magnitude (close_to_golden): reductions and
// products sum in a different order on the GPU, so f32 results agree to about 1e-6 of that,
// and 1e-4 leaves room while a wrong mask or a missing term is off by O(1).
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "bert_golden_support.h"
#include "core/device_api.h"
#include "nn/functional.h"
#include "nn/models/bert.h"
#include "optim/grad_scaler.h"
#include "optim/sgd_adam.h"
#include "test_util.h"

using namespace ember;
using ember::testing::random_index;
using ember::testing::random_tensor;
using ember::testing::uniform_int;
using ember::testing::bert_golden::close_to_golden;
using ember::testing::bert_golden::is_key_bias;
using ember::testing::bert_golden::max_abs;

namespace {

const Device kGpu = Device::cuda(0);
constexpr double kTol = 1e-4;
constexpr int kAdamWSteps = 5;
constexpr double kLr = 1e-3;

class Mlp : public nn::Module {
 public:
  Mlp(int64_t in, int64_t hidden, int64_t out, double p) : Module("Mlp") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(in, hidden));
    norm = register_module("norm", std::make_shared<nn::LayerNorm>(Shape{hidden}));
    drop = register_module("drop", std::make_shared<nn::Dropout>(p));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(hidden, out));
  }
  Tensor forward(const Tensor& x) override {
    return fc2->forward(drop->forward(norm->forward(gelu(fc1->forward(x)))));
  }
  std::shared_ptr<nn::Linear> fc1, fc2;
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<nn::Dropout> drop;
};

uint64_t fresh_seed() { return uint64_t(uniform_int(0, 1000000000)); }

// Copies `cpu`'s weights into `gpu` (built with the same structure), then moves it to the GPU.
void mirror_to_gpu(const nn::Module& cpu, nn::Module& gpu) {
  gpu.load_state_dict(cpu.state_dict());
  gpu.to(kGpu);
  const auto a = cpu.named_parameters(), b = gpu.named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].first, b[i].first);
    ASSERT_EQ(b[i].second.device(), kGpu) << b[i].first;
    ASSERT_TRUE(close_to_golden(a[i].first, b[i].second, a[i].second, 0.0));
  }
}

::testing::AssertionResult same_scalar(const Tensor& gpu, const Tensor& cpu, double rtol) {
  const double g = gpu.item<double>(), c = cpu.item<double>();
  if (std::isfinite(g) && std::abs(g - c) <= rtol * std::abs(c) + 1e-7) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "GPU " << g << " vs CPU " << c;
}

// Every parameter's gradient on the GPU against the CPU's. The attention key bias gets a
// gradient that is mathematically zero (softmax ignores a shift shared by all keys): both
// must be rounding noise.
void expect_same_grads(const nn::Module& cpu, const nn::Module& gpu, double tol) {
  const auto a = cpu.named_parameters(), b = gpu.named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const std::string& name = a[i].first;
    const Tensor gc = a[i].second.grad(), gg = b[i].second.grad();
    ASSERT_TRUE(gc.defined()) << name;
    ASSERT_TRUE(gg.defined()) << name;
    EXPECT_EQ(gg.device(), kGpu) << name;
    EXPECT_EQ(gg.dtype(), DType::f32) << name;
    if (is_key_bias(name)) {
      EXPECT_LT(max_abs(gg), 1e-5) << name;
      EXPECT_LT(max_abs(gc), 1e-5) << name;
      continue;
    }
    EXPECT_TRUE(close_to_golden("grad " + name, gg, gc, tol));
  }
}

// Parameters after the optimizer steps. A noise gradient (the key bias) moves a parameter by
// up to lr per step in a random direction under Adam, so there only the bound is checked.
void expect_same_params(const nn::Module& cpu, const nn::Module& gpu, const nn::StateDict& before, double tol) {
  const auto a = cpu.named_parameters(), b = gpu.named_parameters();
  ASSERT_EQ(a.size(), b.size());
  int moved = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const std::string& name = a[i].first;
    EXPECT_EQ(b[i].second.device(), kGpu) << name;
    if (is_key_bias(name)) {
      EXPECT_LE(max_abs(sub(b[i].second.to(Device::cpu()), a[i].second)), 2.0 * kAdamWSteps * kLr + 1e-6) << name;
      continue;
    }
    EXPECT_TRUE(close_to_golden("after AdamW " + name, b[i].second, a[i].second, tol));
    if (!close_to_golden(name, a[i].second, before.at(name), 10 * tol)) ++moved;
  }
  EXPECT_GT(moved, int(a.size()) / 2) << "most parameters should have moved well beyond the tolerance";
}

// ---- the MLP

void run_mlp(double p) {
  SCOPED_TRACE("p " + std::to_string(p) + " seed " + std::to_string(ember::testing::test_seed()));
  const int64_t batch = uniform_int(9, 40), in = uniform_int(20, 70), hidden = uniform_int(100, 300), out = 7;
  manual_seed(fresh_seed());
  Mlp cpu(in, hidden, out, p), gpu(in, hidden, out, p);
  mirror_to_gpu(cpu, gpu);
  cpu.train();
  gpu.train();

  const Tensor x = random_tensor({batch, in});
  const Tensor target = random_index({batch}, out);
  Tensor xc = x.clone(), xg = x.to(kGpu);
  xc.requires_grad_();
  xg.requires_grad_();
  const uint64_t seed = fresh_seed();
  manual_seed(seed);
  const Tensor logits_c = cpu.forward(xc);
  const GeneratorState after_cpu = default_generator().get_state();
  manual_seed(seed);
  const Tensor logits_g = gpu.forward(xg);
  const GeneratorState after_gpu = default_generator().get_state();
  EXPECT_EQ(after_gpu.offset, after_cpu.offset) << "both devices drew the same number of counters";
  EXPECT_EQ(logits_g.device(), kGpu);
  EXPECT_TRUE(close_to_golden("logits", logits_g, logits_c, kTol));
  if (p > 0) {
    // Dropout really dropped: eval-mode logits are different.
    gpu.eval();
    EXPECT_FALSE(close_to_golden("eval logits", gpu.forward(xg.detach()), logits_c, 1e-2));
    gpu.train();
  }
  const Tensor loss_c = cross_entropy(logits_c, target), loss_g = cross_entropy(logits_g, target.to(kGpu));
  EXPECT_TRUE(same_scalar(loss_g, loss_c, 1e-5));
  loss_c.backward();
  loss_g.backward();
  expect_same_grads(cpu, gpu, kTol);
  ASSERT_TRUE(xg.grad().defined());
  EXPECT_TRUE(close_to_golden("input grad", xg.grad(), xc.grad(), kTol));

  // Five AdamW steps on fresh batches, the same on both devices, dropout streams included.
  nn::StateDict before;
  for (const auto& [name, t] : cpu.named_parameters()) before[name] = t.clone();
  optim::AdamW opt_c(cpu.parameters(), {.lr = kLr}), opt_g(gpu.parameters(), {.lr = kLr});
  for (int step = 0; step < kAdamWSteps; ++step) {
    opt_c.zero_grad();
    opt_g.zero_grad();
    const Tensor xs = random_tensor({batch, in});
    const Tensor ts = random_index({batch}, out);
    const uint64_t s = fresh_seed();
    manual_seed(s);
    const Tensor lc = cross_entropy(cpu.forward(xs), ts);
    manual_seed(s);
    const Tensor lg = cross_entropy(gpu.forward(xs.to(kGpu)), ts.to(kGpu));
    EXPECT_TRUE(same_scalar(lg, lc, 1e-4)) << "step " << step;
    lc.backward();
    lg.backward();
    opt_c.step();
    opt_g.step();
  }
  expect_same_params(cpu, gpu, before, kTol);
}

// ---- the tiny BERT

nn::BertConfig tiny_config(double dropout) {
  nn::BertConfig c;
  c.vocab_size = 97;
  c.hidden_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.intermediate_size = 64;
  c.max_position_embeddings = 24;
  c.hidden_dropout_prob = dropout;
  c.attention_probs_dropout_prob = dropout;
  c.num_labels = 3;
  c.validate();
  return c;
}

// A padded batch: row b holds len[b] tokens (the first row is full), then padding (id 0,
// attention 0); segment 1 from the middle of each row; MLM labels on about a quarter of the
// real tokens (at least one per row), -100 elsewhere.
struct BertBatch {
  Tensor ids, mask, types, mlm_labels, cls_labels;
  BertBatch to(Device d) const {
    return {ids.to(d), mask.to(d), types.to(d), mlm_labels.to(d), cls_labels.to(d)};
  }
};

BertBatch random_bert_batch(const nn::BertConfig& c, int64_t batch, int64_t len) {
  std::vector<int64_t> ids(size_t(batch * len)), mask(ids.size()), types(ids.size()), labels(ids.size(), -100);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t n = b == 0 ? len : uniform_int(2, len);
    for (int64_t i = 0; i < len; ++i) {
      const size_t k = size_t(b * len + i);
      if (i >= n) continue;  // padding: id 0, mask 0, type 0
      ids[k] = uniform_int(4, c.vocab_size - 1);
      mask[k] = 1;
      types[k] = i >= n / 2 ? 1 : 0;
      if (i == 1 || uniform_int(0, 3) == 0) labels[k] = uniform_int(4, c.vocab_size - 1);
    }
  }
  BertBatch out;
  out.ids = from_vector(ids, {batch, len});
  out.mask = from_vector(mask, {batch, len});
  out.types = from_vector(types, {batch, len});
  out.mlm_labels = from_vector(labels, {batch, len});
  out.cls_labels = random_index({batch}, c.num_labels);
  return out;
}

template <typename M>
nn::ModelOutput forward(M& model, const BertBatch& b) {
  if constexpr (std::is_same_v<M, nn::BertForMaskedLM>) {
    return model.forward(b.ids, b.mask, b.types, b.mlm_labels);
  } else {
    return model.forward(b.ids, b.mask, b.types, b.cls_labels);
  }
}

template <typename M>
void run_bert(double dropout) {
  SCOPED_TRACE(std::string(std::is_same_v<M, nn::BertForMaskedLM> ? "mlm" : "cls") + " dropout " +
               std::to_string(dropout) + " seed " + std::to_string(ember::testing::test_seed()));
  const nn::BertConfig cfg = tiny_config(dropout);
  manual_seed(fresh_seed());
  M cpu(cfg), gpu(cfg);
  mirror_to_gpu(cpu, gpu);
  cpu.train();
  gpu.train();
  const int64_t batch = uniform_int(2, 5), len = uniform_int(5, cfg.max_position_embeddings);
  const BertBatch bc = random_bert_batch(cfg, batch, len), bg = bc.to(kGpu);

  const uint64_t seed = fresh_seed();
  manual_seed(seed);
  const nn::ModelOutput oc = forward(cpu, bc);
  const uint64_t offset_cpu = default_generator().get_state().offset;
  manual_seed(seed);
  const nn::ModelOutput og = forward(gpu, bg);
  EXPECT_EQ(default_generator().get_state().offset, offset_cpu);
  ASSERT_TRUE(og.loss.defined());
  EXPECT_EQ(og.logits.device(), kGpu);
  EXPECT_EQ(og.loss.dtype(), DType::f32);
  EXPECT_TRUE(close_to_golden("logits", og.logits, oc.logits, kTol));
  EXPECT_TRUE(same_scalar(og.loss, oc.loss, 1e-5));
  if (dropout > 0) {
    gpu.eval();
    EXPECT_FALSE(close_to_golden("eval logits", forward(gpu, bg).logits, oc.logits, 1e-3))
        << "dropout should change the training-mode logits";
    gpu.train();
  }
  oc.loss.backward();
  og.loss.backward();
  expect_same_grads(cpu, gpu, kTol);
  if constexpr (std::is_same_v<M, nn::BertForMaskedLM>) {
    // The tied decoder is the word embedding on both devices.
    EXPECT_EQ(gpu.decoder_weight.device(), kGpu);
  }

  nn::StateDict before;
  for (const auto& [name, p] : cpu.named_parameters()) before[name] = p.clone();
  optim::AdamW opt_c(cpu.parameters(), {.lr = kLr}), opt_g(gpu.parameters(), {.lr = kLr});
  for (int step = 0; step < kAdamWSteps; ++step) {
    opt_c.zero_grad();
    opt_g.zero_grad();
    const BertBatch sc = random_bert_batch(cfg, batch, len), sg = sc.to(kGpu);
    const uint64_t s = fresh_seed();
    manual_seed(s);
    const Tensor lc = forward(cpu, sc).loss;
    manual_seed(s);
    const Tensor lg = forward(gpu, sg).loss;
    EXPECT_TRUE(same_scalar(lg, lc, 1e-4)) << "step " << step;
    lc.backward();
    lg.backward();
    opt_c.step();
    opt_g.step();
  }
  expect_same_params(cpu, gpu, before, kTol);
}

}  // namespace

TEST(CudaAutograd, MlpWithoutDropoutMatchesCpu) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  run_mlp(0.0);
}

TEST(CudaAutograd, MlpWithDropoutMatchesCpuForTheSameGeneratorState) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  run_mlp(0.3);
}

TEST(CudaAutograd, TinyBertMaskedLmMatchesCpu) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  run_bert<nn::BertForMaskedLM>(0.0);
}

TEST(CudaAutograd, TinyBertMaskedLmWithDropoutMatchesCpu) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  run_bert<nn::BertForMaskedLM>(0.1);
}

TEST(CudaAutograd, TinyBertClassifierMatchesCpu) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  run_bert<nn::BertForSequenceClassification>(0.0);
}

TEST(CudaAutograd, TinyBertClassifierWithDropoutMatchesCpu) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  run_bert<nn::BertForSequenceClassification>(0.1);
}

// bf16 autocast on CUDA: the loss stays within bf16's reach of the f32 loss, parameters and
// their gradients stay f32, and the gradients are near the f32 ones.
TEST(CudaAutograd, Bf16AutocastTinyBertStaysNearF32) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  const nn::BertConfig cfg = tiny_config(0.0);
  manual_seed(fresh_seed());
  nn::BertForMaskedLM model(cfg);
  model.to(kGpu);
  const BertBatch b = random_bert_batch(cfg, 4, 16).to(kGpu);

  const nn::ModelOutput f32 = forward(model, b);
  f32.loss.backward();
  std::vector<Tensor> f32_grads;
  for (const Tensor& p : model.parameters()) f32_grads.push_back(p.grad().clone());
  model.zero_grad();

  nn::ModelOutput half;
  {
    AutocastGuard autocast(DeviceType::CUDA, DType::bf16);
    EXPECT_TRUE(autocast_enabled(DeviceType::CUDA));
    half = forward(model, b);
  }
  EXPECT_EQ(half.logits.dtype(), DType::bf16);
  EXPECT_EQ(half.loss.dtype(), DType::f32);
  EXPECT_EQ(half.loss.device(), kGpu);
  const double l32 = f32.loss.item<double>(), l16 = half.loss.item<double>();
  EXPECT_TRUE(std::isfinite(l16));
  EXPECT_LE(std::abs(l16 - l32), 1e-2 * std::abs(l32)) << "bf16 " << l16 << " vs f32 " << l32;
  EXPECT_NE(l16, l32) << "autocast should have changed the rounding";
  half.loss.backward();
  const auto params = model.named_parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, p] = params[i];
    EXPECT_EQ(p.dtype(), DType::f32) << name;
    const Tensor g = p.grad();
    ASSERT_TRUE(g.defined()) << name;
    EXPECT_EQ(g.dtype(), DType::f32) << name;
    EXPECT_EQ(g.device(), kGpu) << name;
    if (is_key_bias(name)) continue;
    EXPECT_TRUE(close_to_golden("bf16 grad " + name, g, f32_grads[i], 5e-2));
  }
}

// The fp16 GradScaler on CUDA: clean steps unscale the gradients (grad / scale) and step; a
// step whose gradients hold an inf is skipped, leaves the parameters unchanged and halves the
// scale.
TEST(CudaAutograd, GradScalerFp16SkipsAStepWithAnInfGradient) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  manual_seed(fresh_seed());
  Mlp model(24, 64, 5, 0.0);
  model.to(kGpu);
  optim::AdamW opt(model.parameters(), {.lr = kLr});
  optim::GradScaler scaler({.init_scale = 1024.0});
  const Tensor x = random_tensor({16, 24}).to(kGpu), target = random_index({16}, 5).to(kGpu);

  auto scaled_backward = [&] {
    opt.zero_grad();
    Tensor loss;
    {
      AutocastGuard autocast(DeviceType::CUDA, DType::f16);
      loss = cross_entropy(model.forward(x), target);
    }
    EXPECT_EQ(loss.dtype(), DType::f32);
    const Tensor scaled = scaler.scale(loss);
    EXPECT_NEAR(scaled.item<double>(), loss.item<double>() * scaler.get_scale(),
                1e-6 * std::abs(loss.item<double>() * scaler.get_scale()));
    scaled.backward();
  };

  // A clean step: unscale_ divides every gradient by the scale in place, then step() steps.
  scaled_backward();
  std::vector<Tensor> scaled_grads;
  for (const Tensor& p : model.parameters()) scaled_grads.push_back(p.grad().clone());
  scaler.unscale_(opt);
  std::vector<Tensor> params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(close_to_golden("unscaled grad", params[i].grad(), mul(scaled_grads[i], 1.0 / 1024.0), 1e-6));
  std::vector<Tensor> before;
  for (const Tensor& p : params) before.push_back(p.clone());
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 1024.0);
  EXPECT_FALSE(close_to_golden("fc1 weight after a clean step", params[0], before[0], 1e-6));

  // One inf in one gradient (at a random element of a random parameter): the step is skipped.
  scaled_backward();
  const size_t which = size_t(uniform_int(0, int64_t(params.size()) - 1));
  std::vector<float> g = params[which].grad().to_vector<float>();
  g[size_t(uniform_int(0, int64_t(g.size()) - 1))] = std::numeric_limits<float>::infinity();
  params[which].set_grad(from_vector(g, params[which].shape()).to(kGpu));
  before.clear();
  for (const Tensor& p : params) before.push_back(p.clone());
  EXPECT_FALSE(scaler.step(opt));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 512.0);
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(close_to_golden("parameter after a skipped step", params[i], before[i], 0.0)) << i;

  // The next clean step goes through again at the reduced scale.
  scaled_backward();
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
  EXPECT_FALSE(close_to_golden("fc1 weight after the next step", params[0], before[0], 1e-6));
}
