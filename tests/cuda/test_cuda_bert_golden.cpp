// The BERT golden parity test on the GPU: the transformers checkpoints of
// tests/golden/bert/{mlm,cls}, moved to cuda:0, give transformers' logits, loss, gradients and
// AdamW trajectory on the padded golden batch, as on the CPU (tests/nn/test_bert_golden.cpp,
// whose loading and comparison helpers tests/support/bert_golden_support.h shares). Products
// run in full f32 (TF32 is switched off for the test), so the CPU's tolerance holds. Every
// test skips without a CUDA device.
#include <type_traits>

#include "bert_golden_support.h"
#include "core/device_api.h"
#include "kernels/cuda/cublas_handles.h"
#include "nn/io/safetensors.h"
#include "nn/models/pretrained.h"
#include "optim/sgd_adam.h"
#include "test_util.h"

using namespace ember;
using namespace ember::nn;

namespace {

using namespace ember::testing::bert_golden;

const Device kGpu = Device::cuda(0);

// TF32 products (EMBER_ALLOW_TF32=1) would be 1e-3 off; the goldens are full f32.
class NoTf32 {
 public:
  NoTf32() : previous_(cuda::allow_tf32()) { cuda::set_allow_tf32(false); }
  ~NoTf32() { cuda::set_allow_tf32(previous_); }
  NoTf32(const NoTf32&) = delete;
  NoTf32& operator=(const NoTf32&) = delete;

 private:
  bool previous_;
};

template <typename M>
class CudaBertGolden : public ::testing::Test {
 protected:
  std::string kind() const { return Kind<M>::name; }
  std::string checkpoint() const { return golden_dir() + "/" + kind(); }
  // Loaded on the CPU, then moved in place (tied weights stay tied).
  std::shared_ptr<M> load_on_gpu() const {
    auto model = from_pretrained<M>(checkpoint());
    model->to(kGpu);
    for (const auto& [name, p] : model->named_parameters()) EXPECT_EQ(p.device(), kGpu) << name;
    return model;
  }
  NoTf32 no_tf32_;
};

using Models = ::testing::Types<BertForMaskedLM, BertForSequenceClassification>;
TYPED_TEST_SUITE(CudaBertGolden, Models, ModelNames);

TYPED_TEST(CudaBertGolden, ForwardMatchesTransformers) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const Golden g(this->kind());
  auto model = this->load_on_gpu();
  model->eval();
  ModelOutput out = run(*model, g, true, kGpu);
  ASSERT_TRUE(out.logits.defined());
  EXPECT_EQ(out.logits.device(), kGpu);
  EXPECT_EQ(out.loss.device(), kGpu);
  EXPECT_TRUE(close_to_golden("logits", out.logits, g.at("logits")));
  EXPECT_TRUE(close_to_golden("loss", out.loss, g.at("loss")));
  // Training mode (dropout probabilities are 0) and no labels give the same logits.
  model->train();
  ModelOutput unlabelled = run(*model, g, false, kGpu);
  EXPECT_TRUE(close_to_golden("logits (train mode)", unlabelled.logits, g.at("logits")));
  EXPECT_FALSE(unlabelled.loss.defined());
}

TYPED_TEST(CudaBertGolden, GradientsMatchTransformers) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const Golden g(this->kind());
  auto model = this->load_on_gpu();
  ModelOutput out = run(*model, g, true, kGpu);
  out.loss.backward();
  expect_gradients_match(*model, g, kGpu, kTol, "grad ", /*key_bias_is_noise=*/true);
}

// bf16 autocast on the GPU: the CPU test's tolerances (products in bf16 through two layers).
TYPED_TEST(CudaBertGolden, Bf16AutocastStaysNearTransformers) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const Golden g(this->kind());
  auto model = this->load_on_gpu();
  ModelOutput out;
  {
    AutocastGuard autocast(DeviceType::CUDA, DType::bf16);
    out = run(*model, g, true, kGpu);
  }
  EXPECT_EQ(out.logits.dtype(), DType::bf16);
  EXPECT_EQ(out.loss.dtype(), DType::f32);
  EXPECT_TRUE(close_to_golden("bf16 logits", out.logits.to(DType::f32), g.at("logits"), 2e-2));
  EXPECT_TRUE(close_to_golden("bf16 loss", out.loss, g.at("loss"), 1e-2));
  // A bf16 run is measurably not the f32 run (otherwise autocast was not on).
  EXPECT_FALSE(close_to_golden("bf16 logits", out.logits.to(DType::f32), g.at("logits"), 1e-6));
  out.loss.backward();
  expect_gradients_match(*model, g, kGpu, 3e-2, "bf16 grad ", /*key_bias_is_noise=*/false);
}

TYPED_TEST(CudaBertGolden, AdamWStepsMatchTransformers) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const Golden g(this->kind());
  auto model = this->load_on_gpu();
  optim::AdamW opt(model->parameters(), {.lr = 1e-3, .weight_decay = 0.01});
  std::vector<float> losses;
  for (int step = 0; step < kAdamWSteps; ++step) {
    opt.zero_grad();
    Tensor loss = run(*model, g, true, kGpu).loss;
    losses.push_back(loss.item<float>());
    loss.backward();
    opt.step();
  }
  EXPECT_TRUE(close_to_golden("losses before each step", from_vector(losses, {kAdamWSteps}), g.at("adamw_losses")));
  const auto params = g.with_prefix("adamw.");
  EXPECT_GE(params.size(), 6u);
  const auto before_all = load_safetensors(this->checkpoint() + "/model.safetensors");
  for (const auto& [name, expected] : params) {
    // The step must have moved the parameter well beyond the tolerance for this to test anything.
    EXPECT_FALSE(close_to_golden(name, before_all.at(name), expected)) << name << " barely moved";
    const Tensor p = model->parameter(name);
    EXPECT_EQ(p.device(), kGpu) << name;
    EXPECT_TRUE(close_to_golden("after AdamW " + name, p, expected));
  }
  if constexpr (std::is_same_v<TypeParam, BertForMaskedLM>) {
    // The tied decoder followed the word embeddings on the device.
    EXPECT_EQ(model->decoder_weight.device(), kGpu);
    EXPECT_TRUE(close_to_golden("decoder weight", model->decoder_weight,
                                g.at("adamw.bert.embeddings.word_embeddings.weight")));
  }
}

// The GPU and the CPU agree with each other far more closely than either with the goldens'
// tolerance: same checkpoint, same batch, logits within 1e-5 of their largest magnitude.
TYPED_TEST(CudaBertGolden, GpuLogitsMatchTheCpuModel) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const Golden g(this->kind());
  auto cpu_model = from_pretrained<TypeParam>(this->checkpoint());
  auto gpu_model = this->load_on_gpu();
  cpu_model->eval();
  gpu_model->eval();
  const ModelOutput a = run(*cpu_model, g), b = run(*gpu_model, g, true, kGpu);
  EXPECT_TRUE(close_to_golden("GPU logits vs CPU", b.logits, a.logits, 1e-5));
  EXPECT_TRUE(close_to_golden("GPU loss vs CPU", b.loss, a.loss, 1e-5));
}

}  // namespace
