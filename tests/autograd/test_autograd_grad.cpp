// autograd::grad: gradients returned rather than accumulated, for leaves and non-leaves;
// create_graph through a formula that is first-order only fails on the second backward,
// naming the node; the argument errors.
#include <cmath>
#include <vector>

#include "autograd/engine.h"
#include "first_order_cube.h"
#include "same_bits.h"
#include "test_util.h"

using namespace ember;

TEST(AutogradGrad, ReturnsGradientsAndLeavesDotGradAlone) {
  Tensor x = from_vector<double>({1.0, 2.0, 3.0}).requires_grad_();
  Tensor w = from_vector<double>({0.5, -1.0, 2.0}).requires_grad_();
  Tensor h = x * w;
  const Tensor y = sum(h * h);  // dy/dx = 2 x w^2, dy/dh = 2 h
  const std::vector<Tensor> g = autograd::grad({y}, {x, h}, {}, /*create_graph=*/false);
  EXPECT_EQ(g[0].to_vector<double>(), (std::vector<double>{0.5, 4.0, 24.0}));
  EXPECT_EQ(g[1].to_vector<double>(), (std::vector<double>{1.0, -4.0, 12.0}));
  EXPECT_FALSE(x.grad().defined());
  EXPECT_FALSE(w.grad().defined());
  EXPECT_FALSE(g[0].requires_grad());
}

TEST(AutogradGrad, AnInputTheGradientDoesNotReachGetsAnUndefinedTensor) {
  Tensor x = from_vector<double>({1.0, 2.0}).requires_grad_();
  Tensor unused = from_vector<double>({3.0}).requires_grad_();
  const std::vector<Tensor> g = autograd::grad({sum(x * 3.0)}, {unused, x});
  EXPECT_FALSE(g[0].defined());
  EXPECT_EQ(g[1].to_vector<double>(), (std::vector<double>{3.0, 3.0}));
}

// A formula recorded as first-order reads its inputs without history: its gradient may not be
// differentiated again, and saying so beats a second derivative that silently misses terms.
TEST(AutogradGrad, SecondBackwardThroughAFirstOrderFormulaNamesIt) {
  const Tensor x = ember::testing::random_tensor({4, 3}, DType::f64).requires_grad_();
  const auto loss = [&] { return sum(tanh(ember::testing::first_order_cube(x))); };
  const Tensor g = autograd::grad({loss()}, {x}, {}, /*create_graph=*/true)[0];
  EXPECT_TRUE(ember::testing::same_bits(g, autograd::grad({loss()}, {x})[0]));  // the graph is kept
  ASSERT_TRUE(g.requires_grad());
  EXPECT_EMBER_ERROR(sum(g * g).backward(), "FirstOrderCubeBackward", "does not support double backward");
}

// linear_cross_entropy's CPU gradients carry a composed history under create_graph: the second
// backward runs, and its x gradient is that of linear followed by cross_entropy.
TEST(AutogradGrad, SecondBackwardThroughLinearCrossEntropyMatchesTheComposition) {
  const Tensor x = ember::testing::random_tensor({2, 3}, DType::f64).requires_grad_();
  const Tensor w = ember::testing::random_tensor({4, 3}, DType::f64);
  const Tensor target = from_vector<int64_t>({1, 3});
  const auto penalty_gradient = [&](const Tensor& loss) {
    const Tensor g = autograd::grad({loss}, {x}, {}, /*create_graph=*/true)[0];
    return autograd::grad({sum(g * g)}, {x})[0].to_vector<double>();
  };
  const std::vector<double> fused = penalty_gradient(linear_cross_entropy(x, w, Tensor(), target).second);
  const std::vector<double> composed = penalty_gradient(cross_entropy(linear(x, w, Tensor()), target));
  ASSERT_EQ(fused.size(), composed.size());
  for (size_t i = 0; i < fused.size(); ++i) EXPECT_NEAR(fused[i], composed[i], 1e-12 + 1e-9 * std::abs(composed[i]));
}

TEST(AutogradGrad, ArgumentErrors) {
  Tensor x = from_vector<double>({1.0, 2.0}).requires_grad_();
  const Tensor constant = from_vector<double>({1.0, 2.0});
  EXPECT_EMBER_ERROR(autograd::grad({sum(x)}, {constant}), "grad: input 0 of shape [2] does not require grad");
  EXPECT_EMBER_ERROR(autograd::grad({sum(x)}, {x, Tensor()}), "grad: input 1 is undefined");
  EXPECT_EMBER_ERROR(autograd::grad({sum(x), sum(x)}, {x}, {Tensor()}), "grad: 1 grad_outputs for 2 outputs");
  EXPECT_EMBER_ERROR(autograd::grad({}, {x}), "grad: no outputs to differentiate");
  EXPECT_EMBER_ERROR(autograd::grad({x * 2.0}, {x}), "one-element outputs", "[2]");
}

// Layers below a captured activation, and branches that reach no input, compute gradients
// nobody reads: grad() does not run them, while an ordinary backward does.
TEST(AutogradGrad, RunsOnlyTheNodesOnAPathToAnInput) {
  int below_runs = 0;
  int branch_runs = 0;
  auto counting_identity = [](const Tensor& in, int* runs) {
    Tensor out = in.detach().clone();
    autograd::record("CountingIdentity", {in}, {out}, [runs](const autograd::Tensors& g) -> autograd::Tensors {
      ++*runs;
      return {g[0]};
    });
    return out;
  };
  Tensor x = from_vector<double>({1.0, -2.0}).requires_grad_();
  Tensor w = from_vector<double>({3.0, 4.0}).requires_grad_();
  auto forward = [&](Tensor* h) {
    *h = counting_identity(x, &below_runs) * 2.0;  // the captured activation
    const Tensor other = counting_identity(w, &branch_runs);  // a branch grad() need not enter
    return sum(*h * *h) + sum(other * *h);
  };
  Tensor h;
  const Tensor y = forward(&h);
  const std::vector<Tensor> g = autograd::grad({y}, {h}, {}, /*create_graph=*/false);
  EXPECT_EQ(below_runs, 0);
  EXPECT_EQ(branch_runs, 0);
  // dy/dh = 2 h + other = 2 * (2, -4) + (3, 4)
  EXPECT_EQ(g[0].to_vector<double>(), (std::vector<double>{7.0, -4.0}));
  forward(&h).backward();
  EXPECT_EQ(below_runs, 1);
  EXPECT_EQ(branch_runs, 1);
}
