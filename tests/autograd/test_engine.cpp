// The autograd engine: accumulation, graph reuse, hooks, grad modes, and view backward formulas.
#include "test_util.h"

#include <cmath>

using namespace ember;
using ember::testing::random_tensor;

namespace {
Tensor f64(const Shape& s) { return random_tensor(s, DType::f64).requires_grad_(); }
}  // namespace

TEST(AutogradEngine, GradientsAccumulateOverUsesAndCalls) {
  Tensor x = from_vector<double>({1.0, 2.0, 3.0}).requires_grad_();
  Tensor y = sum(x * x + x);  // dy/dx = 2x + 1
  y.backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{3, 5, 7}));
  sum(x * 2.0).backward();  // accumulates: + 2
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{5, 7, 9}));
  EXPECT_TRUE(x.is_leaf());
  EXPECT_FALSE(y.is_leaf());
  EXPECT_TRUE(y.requires_grad());
}

// Gradients meeting at a non-leaf are summed in the first one's buffer only when nothing else
// holds it. Here h + h's backward hands one tensor to both of its inputs, so h's slot receives
// the same tensor twice: adding it into itself in place would count it four times.
TEST(AutogradEngine, GradientsMeetingAtANonLeafNeverWriteIntoTensorsOthersHold) {
  Tensor x = from_vector<double>({1.0, 2.0, 3.0}).requires_grad_();
  Tensor h = x * 2.0;
  Tensor y = sum((h + h) * 3.0 + h * h + exp(h) * 0.0);  // dy/dh = 6 + 2h
  y.backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{20, 28, 36}));  // 2 (6 + 4x)
  Tensor z = x * 1.0;
  sum(z + z + z).backward();  // three uses, one slot: + 3
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{23, 31, 39}));
}

TEST(AutogradEngine, SecondBackwardNeedsRetainGraph) {
  Tensor x = from_vector<double>({1.0, 2.0}).requires_grad_();
  Tensor y = sum(exp(x));
  y.backward(Tensor(), /*retain_graph=*/true);
  y.backward();
  auto g = x.grad().to_vector<double>();
  EXPECT_NEAR(g[0], 2 * std::exp(1.0), 1e-12);
  EXPECT_EMBER_ERROR(y.backward(), "backward", "retain_graph");
}

TEST(AutogradEngine, NonScalarNeedsExplicitGradient) {
  Tensor x = f64({3});
  Tensor y = x * 3.0;
  EXPECT_EMBER_ERROR(y.backward(), "backward", "one-element", "[3]");
  y.backward(ones({3}, {DType::f64}));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{3, 3, 3}));
  EXPECT_EMBER_ERROR((x * 2.0).backward(ones({4}, {DType::f64})), "backward", "[4]", "[3]");
}

TEST(AutogradEngine, NoGradAndDetachStopHistory) {
  Tensor x = f64({2});
  {
    NoGradGuard ng;
    Tensor y = x * 2.0;
    EXPECT_FALSE(y.requires_grad());
    {
      EnableGradGuard eg;
      EXPECT_TRUE((x * 2.0).requires_grad());
    }
  }
  Tensor d = x.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_EQ(d.raw_data(), x.raw_data());  // shares storage
  Tensor z = sum(x * d);                  // gradient flows only through x
  z.backward();
  EXPECT_EQ(x.grad().to_vector<double>(), d.to_vector<double>());
  EXPECT_EMBER_ERROR(zeros({2}, {DType::i64}).requires_grad_(), "requires_grad_", "int64");
  EXPECT_EMBER_ERROR(sum(x).detach().backward(), "backward", "does not require grad");
}

TEST(AutogradEngine, InPlaceOnLeafRequiringGradIsRefused) {
  Tensor x = f64({2});
  EXPECT_EMBER_ERROR(x.fill_(1.0), "fill_", "requires grad");
  NoGradGuard ng;
  x.fill_(1.0);  // allowed under no_grad, as optimizers do
  EXPECT_EQ(x.to_vector<double>(), (std::vector<double>{1, 1}));
}

TEST(AutogradEngine, PostAccumulateHooksFireInReverseOrderAfterAccumulation) {
  Tensor a = f64({2}), b = f64({2}), c = f64({2});
  std::vector<std::string> fired;
  a.register_post_accumulate_grad_hook([&](const Tensor& t) {
    EXPECT_TRUE(t.grad().defined());
    fired.push_back("a");
  });
  b.register_post_accumulate_grad_hook([&](const Tensor&) { fired.push_back("b"); });
  c.register_post_accumulate_grad_hook([&](const Tensor&) { fired.push_back("c"); });
  // a is used first, c last: backward reaches c first.
  Tensor h = tanh(a);
  h = tanh(h + b);
  h = tanh(h + c);
  sum(h).backward();
  EXPECT_EQ(fired, (std::vector<std::string>{"c", "b", "a"}));
  Tensor n = zeros({2});
  EXPECT_EMBER_ERROR(n.register_post_accumulate_grad_hook([](const Tensor&) {}), "leaf");
}

TEST(AutogradEngine, SharedSubgraphRunsOnce) {
  Tensor x = f64({3});
  Tensor h = exp(x);
  Tensor y = sum(h * h) + sum(h);  // h feeds two consumers
  y.backward();
  auto e = exp(x.detach()).to_vector<double>();
  auto g = x.grad().to_vector<double>();
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(g[i], 2 * e[i] * e[i] + e[i], 1e-10);
}

TEST(AutogradEngine, ViewBackwardsPassGradcheck) {
  using Fn = std::function<Tensor(const Tensor&)>;
  const std::vector<std::pair<const char*, Fn>> views = {
      {"transpose", [](const Tensor& x) { return x.transpose(0, 2); }},
      {"permute", [](const Tensor& x) { return x.permute({2, 0, 1}); }},
      {"slice", [](const Tensor& x) { return x.slice(1, 1, 4, 2); }},
      {"narrow", [](const Tensor& x) { return x.narrow(2, 1, 2); }},
      {"select", [](const Tensor& x) { return x.select(1, -1); }},
      {"view", [](const Tensor& x) { return x.view({6, -1}); }},
      {"reshape-noncontig", [](const Tensor& x) { return x.transpose(0, 1).reshape({-1}); }},
      {"expand", [](const Tensor& x) { return x.narrow(0, 0, 1).expand({3, 2, 4, 3}); }},
      {"squeeze-unsqueeze", [](const Tensor& x) { return x.unsqueeze(1).narrow(3, 0, 1).squeeze(); }},
      {"flatten", [](const Tensor& x) { return x.flatten(1); }},
      {"clone", [](const Tensor& x) { return x.clone(); }},
      {"contiguous", [](const Tensor& x) { return x.transpose(1, 2).contiguous(); }},
      {"to-f32-and-back", [](const Tensor& x) { return x.to(DType::f32).to(DType::f64); }},
  };
  for (const auto& [name, fn] : views) {
    SCOPED_TRACE(name);
    Tensor x = random_tensor({2, 4, 3}, DType::f64).requires_grad_();
    GradcheckOptions opt;
    if (std::string(name) == "to-f32-and-back") opt.eps = 1e-2, opt.atol = opt.rtol = 1e-3;  // f32 rounding
    // (fn is copied into the lambda: C++20 lets a lambda capture a structured binding, clang 14 does not.)
    auto r = gradcheck([&, view = fn](const std::vector<Tensor>& in) { return std::vector<Tensor>{view(in[0]) * 1.5}; },
                       {x}, opt);
    EXPECT_TRUE(r.ok) << r.message;
  }
}

TEST(AutogradEngine, GradcheckDetectsAWrongFormula) {
  // A deliberately wrong gradient (detach hides one path) must be caught.
  Tensor x = random_tensor({3}, DType::f64).requires_grad_();
  auto r = gradcheck([](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] * in[0].detach()}; }, {x});
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("analytic"), std::string::npos);
}
