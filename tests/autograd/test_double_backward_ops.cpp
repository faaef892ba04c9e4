// Double backward (autograd::grad with create_graph) through the elementwise ops, reductions,
// views and products of double_backward_op_cases.h: gradgradcheck of each in f64; a WGAN-GP
// gradient penalty on a small MLP critic differentiated into its weights, against finite
// differences of the penalty; a Hessian-vector product and third derivatives against their
// closed forms; and first-order gradients under create_graph equal to an ordinary backward's,
// bit for bit, in f32 and f64.
#include <cmath>
#include <vector>

#include "double_backward_checks.h"
#include "first_order_cube.h"

using namespace ember;
using ember::testing::random_tensor;

namespace {

Tensor leaf(const Shape& s) { return random_tensor(s, DType::f64).requires_grad_(); }

// A copy of t (no history) with element i moved by delta.
Tensor nudged(const Tensor& t, int64_t i, double delta) {
  Tensor c = t.detach().clone();
  c.data_ptr<double>()[i] += delta;
  return c;
}

bool undefined_or_zero(const Tensor& t) {
  if (!t.defined()) return true;
  for (double v : t.to_vector<double>())
    if (v != 0.0) return false;
  return true;
}

// linear -> leaky_relu -> linear, one score per row.
struct Critic {
  Tensor w1, b1, w2, b2;
  Tensor operator()(const Tensor& x) const {
    return linear(leaky_relu(linear(x, w1, b1), 0.2), w2, b2);
  }
};

// WGAN-GP: mean over rows of (||d critic / d x_hat||_2 - 1)^2 at x_hat = e real + (1 - e) fake.
Tensor gradient_penalty(const Critic& critic, const Tensor& real, const Tensor& fake, const Tensor& e,
                        bool create_graph) {
  const Tensor x_hat = add(mul(real, e), mul(fake, add(neg(e), 1.0))).requires_grad_();
  const Tensor score = critic(x_hat);
  const Tensor g = autograd::grad({score}, {x_hat}, {ones(score.shape(), {score.dtype()})}, create_graph)[0];
  const Tensor norm = sqrt(sum(mul(g, g), {1}));
  return mean(pow(sub(norm, 1.0), 2.0));
}

}  // namespace

TEST(DoubleBackwardOps, GradgradcheckInF64) {
  ember::testing::expect_gradgradcheck_passes(ember::testing::double_backward_cases());
}

// The penalty's gradient reaches both weights through the input gradient; the biases only
// move where the leaky_relu kinks are, so theirs is zero.
TEST(DoubleBackwardOps, WganGradientPenaltyMatchesFiniteDifferences) {
  const int64_t batch = 4, features = 3, hidden = 5;
  const Critic critic{leaf({hidden, features}), leaf({hidden}), leaf({1, hidden}), leaf({1})};
  const Tensor real = random_tensor({batch, features}, DType::f64), fake = random_tensor({batch, features}, DType::f64);
  const Tensor e = random_tensor({batch, 1}, DType::f64, false, 0.0, 1.0);

  gradient_penalty(critic, real, fake, e, /*create_graph=*/true).backward();
  ASSERT_TRUE(critic.w1.grad().defined());
  ASSERT_TRUE(critic.w2.grad().defined());
  EXPECT_TRUE(undefined_or_zero(critic.b1.grad()));
  EXPECT_TRUE(undefined_or_zero(critic.b2.grad()));

  const double eps = 1e-6;
  const auto check = [&](const Tensor& analytic, const std::function<Critic(double delta, int64_t i)>& moved,
                         const char* name) {
    const std::vector<double> a = analytic.to_vector<double>();
    for (int64_t i = 0; i < int64_t(a.size()); ++i) {
      const double plus = gradient_penalty(moved(eps, i), real, fake, e, false).item<double>();
      const double minus = gradient_penalty(moved(-eps, i), real, fake, e, false).item<double>();
      const double numeric = (plus - minus) / (2 * eps);
      EXPECT_NEAR(a[size_t(i)], numeric, 1e-6 + 1e-5 * std::abs(numeric)) << name << "[" << i << "]";
    }
  };
  check(critic.w1.grad(), [&](double d, int64_t i) {
    return Critic{nudged(critic.w1, i, d), critic.b1, critic.w2, critic.b2};
  }, "w1");
  check(critic.w2.grad(), [&](double d, int64_t i) {
    return Critic{critic.w1, critic.b1, nudged(critic.w2, i, d), critic.b2};
  }, "w2");
}

// f(x) = x^T A x / 2 + sum(tanh(x)): H v = (A + A^T) v / 2 - 2 tanh(x) (1 - tanh(x)^2) v.
TEST(DoubleBackwardOps, HessianVectorProductMatchesTheClosedForm) {
  const int64_t n = 5;
  const Tensor x = leaf({n});
  const Tensor a = random_tensor({n, n}, DType::f64), v = random_tensor({n}, DType::f64);
  const Tensor f = add(mul(sum(mul(x, matmul(a, x))), 0.5), sum(tanh(x)));
  const Tensor g = autograd::grad({f}, {x}, {}, /*create_graph=*/true)[0];
  const Tensor hv = autograd::grad({sum(mul(g, v))}, {x})[0];

  const std::vector<double> xs = x.to_vector<double>(), as = a.to_vector<double>(), vs = v.to_vector<double>();
  const std::vector<double> got = hv.to_vector<double>();
  for (int64_t i = 0; i < n; ++i) {
    double expected = 0.0;
    for (int64_t j = 0; j < n; ++j) expected += 0.5 * (as[size_t(i * n + j)] + as[size_t(j * n + i)]) * vs[size_t(j)];
    const double t = std::tanh(xs[size_t(i)]);
    expected += -2.0 * t * (1.0 - t * t) * vs[size_t(i)];
    EXPECT_NEAR(got[size_t(i)], expected, 1e-12 * (1.0 + std::abs(expected))) << i;
  }
}

// Gradients of gradients stay differentiable: exp''' = exp, tanh''' = -2 (1 - t^2) (1 - 3 t^2).
TEST(DoubleBackwardOps, ThirdDerivatives) {
  const Tensor x = leaf({4});
  const auto third = [&](const std::function<Tensor(const Tensor&)>& f) {
    const Tensor g1 = autograd::grad({sum(f(x))}, {x}, {}, true)[0];
    const Tensor g2 = autograd::grad({sum(g1)}, {x}, {}, true)[0];
    return autograd::grad({sum(g2)}, {x})[0].to_vector<double>();
  };
  const std::vector<double> xs = x.to_vector<double>(), e = third([](const Tensor& t) { return exp(t); }),
                            th = third([](const Tensor& t) { return tanh(t); });
  for (size_t i = 0; i < xs.size(); ++i) {
    const double t = std::tanh(xs[i]);
    EXPECT_NEAR(e[i], std::exp(xs[i]), 1e-12 * std::exp(xs[i])) << i;
    EXPECT_NEAR(th[i], -2.0 * (1.0 - t * t) * (1.0 - 3.0 * t * t), 1e-12) << i;
  }
}

// d/dx of the gradient of sum(float(x)^3) is 6x, through the casts both ways.
TEST(DoubleBackwardOps, DtypeCastsStayDifferentiable) {
  const Tensor x = leaf({3});
  const Tensor y = x.to(DType::f32);
  const Tensor g = autograd::grad({sum(mul(mul(y, y), y))}, {x}, {}, /*create_graph=*/true)[0];
  ASSERT_EQ(g.dtype(), DType::f64);
  const std::vector<double> xs = x.to_vector<double>(), h = autograd::grad({sum(g)}, {x})[0].to_vector<double>();
  for (size_t i = 0; i < xs.size(); ++i) EXPECT_NEAR(h[i], 6.0 * xs[i], 1e-5 * (1.0 + std::abs(xs[i]))) << i;
}

// create_graph changes what is recorded, not the values: the same kernels run, in f32 (with its
// vectorised exp, tanh and gelu) as in f64; an ordinary backward records nothing.
TEST(DoubleBackwardOps, FirstOrderBitsMatchTheOrdinaryBackward) {
  ember::testing::expect_first_order_bits_match(ember::testing::double_backward_cases());
}

TEST(DoubleBackwardOps, PenaltyInputGradientBitsMatchInF32) {
  // The input gradient of a piecewise linear critic depends on its weights only.
  const auto weight = [](const Shape& s) { return random_tensor(s).requires_grad_(); };
  const Tensor x = random_tensor({4, 3}).requires_grad_();
  const Critic critic{weight({5, 3}), weight({5}), weight({1, 5}), weight({1})};
  const Tensor seed = ones({4, 1});
  const Tensor with_graph = autograd::grad({critic(x)}, {x}, {seed}, true)[0];
  ASSERT_TRUE(with_graph.requires_grad());
  EXPECT_TRUE(ember::testing::same_bits(with_graph, autograd::grad({critic(x)}, {x}, {seed})[0]));
}

// A formula recorded as first-order refuses a second backward through its gradients, naming
// itself; the gradients that do not pass through it stay differentiable.
TEST(DoubleBackwardOps, FirstOrderFormulasNameThemselvesOnASecondBackward) {
  const Tensor x = leaf({3, 2}), w = leaf({2});
  const Tensor y = tanh(mul(ember::testing::first_order_cube(x), w));
  const std::vector<Tensor> g = autograd::grad({sum(y)}, {x, w}, {}, true);
  ASSERT_TRUE(g[0].requires_grad());
  ASSERT_TRUE(g[1].requires_grad());
  EXPECT_EMBER_ERROR(sum(mul(g[0], g[0])).backward(), "FirstOrderCubeBackward", "does not support double backward");
  // w's gradient, the sum over rows of c (1 - t^2) with c = x^3 and t = tanh(c w), reads the
  // cube's value only: d/dw of its square is 2 gw sum(c (-2 t (1 - t^2) c))
  const std::vector<double> hw = autograd::grad({sum(mul(g[1], g[1]))}, {w})[0].to_vector<double>();
  const std::vector<double> xs = x.to_vector<double>(), ws = w.to_vector<double>(), gw = g[1].to_vector<double>();
  for (size_t j = 0; j < 2; ++j) {
    double inner = 0.0;
    for (size_t i = 0; i < 3; ++i) {
      const double c = std::pow(xs[i * 2 + j], 3), t = std::tanh(c * ws[j]);
      inner += c * (-2.0 * t * (1.0 - t * t)) * c;
    }
    EXPECT_NEAR(hw[j], 2.0 * gw[j] * inner, 1e-12 * (1.0 + std::abs(hw[j]))) << j;
  }
}
