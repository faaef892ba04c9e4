// nn::Module semantics and the basic layers.
#include <algorithm>
#include <cmath>

#include "nn/functional.h"
#include "nn/init.h"
#include "nn/layers/attention.h"
#include "nn/layers/basic.h"
#include "nn/layers/containers.h"
#include "nn/losses.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::random_tensor;

namespace {
class Block : public nn::Module {
 public:
  Block() : Module("Block") {
    fc = register_module("fc", std::make_shared<nn::Linear>(4, 3));
    norm = register_module("norm", std::make_shared<nn::LayerNorm>(Shape{3}));
    register_buffer("steps", zeros({1}));
    register_buffer("scratch", zeros({2}), /*persistent=*/false);
  }
  Tensor forward(const Tensor& x) override { return norm->forward(fc->forward(x)); }
  std::shared_ptr<nn::Linear> fc;
  std::shared_ptr<nn::LayerNorm> norm;
};
}  // namespace

TEST(Module, HierarchicalNamesInRegistrationOrder) {
  auto seq = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<Block>(), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(3, 2)});
  std::vector<std::string> names;
  for (auto& [n, p] : seq->named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"0.fc.weight", "0.fc.bias", "0.norm.weight", "0.norm.bias", "2.weight",
                                             "2.bias"}));
  EXPECT_EQ(seq->num_parameters(), 4 * 3 + 3 + 3 + 3 + 3 * 2 + 2);
  auto sd = seq->state_dict();
  EXPECT_TRUE(sd.count("0.steps"));
  EXPECT_FALSE(sd.count("0.scratch"));  // non-persistent buffers stay out
  EXPECT_EQ(seq->forward(randn({5, 4})).shape(), (Shape{5, 2}));
  EXPECT_EMBER_ERROR(seq->parameter("0.fc.nope"), "0.fc.nope");
}

TEST(Module, LoadStateDictReportsMissingAndUnexpected) {
  Block a, b;
  nn::StateDict sd = a.state_dict();
  b.load_state_dict(sd);
  EXPECT_EQ(b.fc->weight.to_vector<float>(), a.fc->weight.to_vector<float>());
  sd.erase("fc.bias");
  sd["extra.weight"] = zeros({1});
  EXPECT_EMBER_ERROR(b.load_state_dict(sd), "missing keys", "fc.bias", "unexpected keys", "extra.weight");
  nn::LoadReport r = b.load_state_dict(sd, /*strict=*/false);
  EXPECT_EQ(r.missing_keys, std::vector<std::string>{"fc.bias"});
  EXPECT_EQ(r.unexpected_keys, std::vector<std::string>{"extra.weight"});
  nn::StateDict bad = a.state_dict();
  bad["fc.weight"] = zeros({2, 2});
  EXPECT_EMBER_ERROR(b.load_state_dict(bad), "fc.weight", "[2, 2]", "[3, 4]");
}

TEST(Module, ToDtypeKeepsParameterIdentity) {
  Block m;
  Tensor w = m.fc->weight;  // a handle held elsewhere, like an optimizer's
  m.to(DType::f64);
  EXPECT_EQ(w.dtype(), DType::f64);
  EXPECT_TRUE(w.requires_grad());
  EXPECT_EQ(m.forward(randn({2, 4}, {DType::f64})).dtype(), DType::f64);
}

TEST(Module, TrainEvalZeroGradApply) {
  auto seq = std::make_shared<nn::Sequential>(
      std::vector<std::shared_ptr<nn::Module>>{std::make_shared<nn::Dropout>(0.5), std::make_shared<Block>()});
  seq->eval();
  for (auto& [n, m] : seq->named_modules()) EXPECT_FALSE(m->is_training()) << n;
  Tensor x = randn({3, 4});
  EXPECT_EQ(seq->forward(x).to_vector<float>(), seq->forward(x).to_vector<float>());  // dropout off
  seq->train();
  sum(seq->forward(x)).backward();
  for (auto& p : seq->parameters()) EXPECT_TRUE(p.grad().defined());
  seq->zero_grad();
  for (auto& p : seq->parameters()) EXPECT_FALSE(p.grad().defined());
  int linears = 0;
  seq->apply([&](nn::Module& m) { linears += m.type_name() == "Linear"; });
  EXPECT_EQ(linears, 1);
}

TEST(Module, TiedParametersAreListedOnce) {
  nn::Module root("Root");
  auto emb = root.register_module("emb", std::make_shared<nn::Embedding>(10, 4));
  auto head = std::make_shared<nn::Module>("Head");
  head->register_parameter("weight", emb->weight);
  root.register_module("head", head);
  EXPECT_EQ(root.parameters().size(), 1u);
  EXPECT_EQ(root.state_dict().size(), 2u);  // both names appear in the state dict
}

TEST(Layers, LinearMatchesReference) {
  nn::Linear lin(5, 3);
  Tensor x = random_tensor({2, 4, 5});
  auto w = reference::from_tensor(lin.weight), b = reference::from_tensor(lin.bias), xr = reference::from_tensor(x);
  reference::RefTensor want({2, 4, 3});
  for (int64_t i = 0; i < 8; ++i)
    for (int64_t o = 0; o < 3; ++o) {
      double acc = b.data[size_t(o)];
      for (int64_t k = 0; k < 5; ++k) acc += xr.data[size_t(i * 5 + k)] * w.data[size_t(o * 5 + k)];
      want.data[size_t(i * 3 + o)] = acc;
    }
  EXPECT_TRUE(all_close(lin.forward(x), want, 1e-5, 1e-5));
  EXPECT_EMBER_ERROR(nn::Linear(0, 3), "Linear");
}

TEST(Layers, EmbeddingPaddingRowIsZeroAndGetsNoGradient) {
  nn::Embedding emb(6, 3, 0);
  EXPECT_EQ(emb.weight.select(0, 0).to_vector<float>(), (std::vector<float>{0, 0, 0}));
  Tensor idx = from_vector<int64_t>({0, 2, 2, 5}, {2, 2});
  Tensor out = emb.forward(idx);
  EXPECT_EQ(out.shape(), (Shape{2, 2, 3}));
  sum(out).backward();
  auto g = emb.weight.grad();
  EXPECT_EQ(g.select(0, 0).to_vector<float>(), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(g.select(0, 2).to_vector<float>(), (std::vector<float>{2, 2, 2}));
}

TEST(Layers, MultiheadAttentionMatchesManualComputation) {
  manual_seed(3);
  nn::MultiheadAttention mha(8, 2);
  mha.eval();
  Tensor x = random_tensor({2, 5, 8});
  Tensor pad = from_vector<int64_t>({0, 0, 0, 1, 1, 0, 0, 0, 0, 0}, {2, 5});
  Tensor out = mha.forward(x, x, x, pad);
  // Manual: per head softmax(q k^T / sqrt(d) masked) v, heads concatenated, projected.
  Tensor q = mha.q_proj->forward(x), k = mha.k_proj->forward(x), v = mha.v_proj->forward(x);
  std::vector<Tensor> heads;
  for (int h = 0; h < 2; ++h) {
    Tensor qh = q.narrow(2, h * 4, 4), kh = k.narrow(2, h * 4, 4), vh = v.narrow(2, h * 4, 4);
    Tensor s = matmul(qh, kh.transpose(1, 2)) / 2.0;
    s = masked_fill(s, ne(pad, 0.0).unsqueeze(1), -1e30);
    heads.push_back(matmul(softmax(s, -1), vh));
  }
  Tensor want = mha.out_proj->forward(cat(heads, 2));
  EXPECT_TRUE(all_close(out, want, 1e-5, 1e-6));
  // A padded key never influences the result.
  Tensor x2 = x.clone();
  x2.select(0, 0).select(0, 4).fill_(100.0);
  EXPECT_TRUE(all_close(mha.forward(x2, x2, x2, pad).select(0, 0).narrow(0, 0, 3), out.select(0, 0).narrow(0, 0, 3),
                        1e-5, 1e-6));
  EXPECT_EMBER_ERROR(nn::MultiheadAttention(10, 3), "divisible");
}

TEST(Layers, CausalAttentionIgnoresTheFuture) {
  nn::MultiheadAttention mha(4, 1);
  Tensor x = random_tensor({1, 4, 4});
  Tensor a = mha.forward(x, x, x, Tensor(), /*causal=*/true);
  Tensor x2 = x.clone();
  x2.select(1, 3).fill_(9.0);
  Tensor b = mha.forward(x2, x2, x2, Tensor(), true);
  EXPECT_TRUE(all_close(b.narrow(1, 0, 3), a.narrow(1, 0, 3), 1e-6, 1e-6));
}

TEST(Layers, TransformerEncoderLayerPostAndPreNorm) {
  for (bool pre : {false, true}) {
    nn::TransformerEncoderLayer layer({.d_model = 16, .nhead = 4, .dim_feedforward = 32, .dropout = 0.0, .norm_first = pre});
    Tensor x = random_tensor({2, 6, 16}).requires_grad_();
    Tensor y = layer.forward(x, Tensor());
    EXPECT_EQ(y.shape(), x.shape());
    if (!pre) {
      // post-LN output rows are normalised
      Tensor m = mean(y, {-1});
      EXPECT_LT(amax(abs(m)).item<double>(), 1e-5);
    }
    sum(y * y).backward();
    EXPECT_TRUE(x.grad().defined());
    for (auto& p : layer.parameters()) EXPECT_TRUE(p.grad().defined());
  }
}

TEST(Losses, CrossEntropyAndMse) {
  Tensor logits = random_tensor({4, 3});
  Tensor target = from_vector<int64_t>({0, 2, 1, -100});
  nn::CrossEntropyLoss ce;
  auto lr = reference::from_tensor(logits);
  double want = 0;
  for (int i = 0; i < 3; ++i) {
    double mx = -1e300, se = 0;
    for (int c = 0; c < 3; ++c) mx = std::max(mx, lr.data[size_t(i * 3 + c)]);
    for (int c = 0; c < 3; ++c) se += std::exp(lr.data[size_t(i * 3 + c)] - mx);
    const int64_t t = std::vector<int64_t>{0, 2, 1}[size_t(i)];
    want += -(lr.data[size_t(i * 3 + t)] - mx - std::log(se));
  }
  EXPECT_NEAR(ce.forward(logits, target).item<double>(), want / 3, 1e-5);
  nn::MSELoss mse;
  Tensor a = from_vector<float>({1, 2, 3}), b = from_vector<float>({1, 0, 0});
  EXPECT_NEAR(mse.forward(a, b).item<double>(), (0 + 4 + 9) / 3.0, 1e-6);
  EXPECT_EMBER_ERROR(mse.forward(a, zeros({2})), "mse_loss", "[3]", "[2]");
}

TEST(Init, DistributionsHaveTheRightSpread) {
  Tensor w = empty({256, 512});
  nn::init::bert_normal_(w);
  const double sd = std::sqrt(var(w).item<double>());
  EXPECT_NEAR(sd, 0.02, 0.001);
  nn::init::xavier_uniform_(w);
  EXPECT_LE(amax(abs(w)).item<double>(), std::sqrt(6.0 / (256 + 512)) + 1e-6);
  nn::init::kaiming_normal_(w);
  EXPECT_NEAR(std::sqrt(var(w).item<double>()), std::sqrt(2.0 / 512), 0.003);
  Tensor v = empty({3});
  EXPECT_EMBER_ERROR(nn::init::xavier_uniform_(v), "fan");
}
