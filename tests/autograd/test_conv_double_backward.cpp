// Double backward through conv1d, conv2d and conv_transpose2d (autograd::grad with
// create_graph), in f64: gradgradcheck over stride, padding ("same" with an odd total too),
// dilation, groups, output_padding and unbatched input; gradient penalties sum(dx^2) and
// sum(dw^2) differentiated into w and x against finite differences of the penalty itself;
// gradients of x meeting from two convolutions; first-order values unchanged by create_graph.
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/gradcheck.h"
#include "test_util.h"

using namespace ember;
using ember::testing::random_tensor;

namespace {

using ConvFn = std::function<Tensor(const Tensor& x, const Tensor& w, const Tensor& b)>;

struct ConvCase {
  std::string name;
  Shape x, w, b;  // b empty: no bias
  ConvFn fn;
};

std::vector<ConvCase> cases() {
  return {
      {"conv1d stride 2 padding 1 dilation 2", {2, 3, 9}, {2, 3, 3}, {2},
       [](const Tensor& x, const Tensor& w, const Tensor& b) { return conv1d(x, w, b, 2, 1, 2); }},
      {"conv1d same even kernel groups 2", {2, 4, 7}, {4, 2, 4}, {},
       [](const Tensor& x, const Tensor& w, const Tensor& b) { return conv1d(x, w, b, 1, "same", 1, 2); }},
      {"conv2d stride 2 padding 1", {2, 2, 6, 5}, {3, 2, 3, 3}, {3},
       [](const Tensor& x, const Tensor& w, const Tensor& b) { return conv2d(x, w, b, {2, 2}, {1, 1}); }},
      {"conv2d dilation 2", {1, 2, 7, 6}, {2, 2, 3, 2}, {2},
       [](const Tensor& x, const Tensor& w, const Tensor& b) { return conv2d(x, w, b, {1, 1}, {2, 1}, {2, 2}); }},
      {"conv2d groups 2 stride 2 padding 1 dilation 2", {1, 4, 7, 7}, {4, 2, 3, 3}, {4},
       [](const Tensor& x, const Tensor& w, const Tensor& b) {
         return conv2d(x, w, b, {2, 2}, {1, 1}, {2, 2}, 2);
       }},
      {"conv2d unbatched same", {4, 5, 4}, {2, 2, 2, 3}, {},
       [](const Tensor& x, const Tensor& w, const Tensor& b) { return conv2d(x, w, b, {1, 1}, "same", {1, 1}, 2); }},
      {"conv_transpose2d stride 2 padding 1 output_padding 1", {2, 4, 3, 3}, {4, 3, 3, 3}, {3},
       [](const Tensor& x, const Tensor& w, const Tensor& b) {
         return conv_transpose2d(x, w, b, {2, 2}, {1, 1}, {1, 1});
       }},
      {"conv_transpose2d groups 2 dilation 2", {2, 4, 3, 3}, {4, 1, 2, 2}, {2},
       [](const Tensor& x, const Tensor& w, const Tensor& b) {
         return conv_transpose2d(x, w, b, {1, 2}, {0, 1}, {0, 1}, 2, {2, 2});
       }},
      // output_padding 1 not below stride 1 (allowed: below dilation 2).
      {"conv_transpose2d output_padding at stride", {1, 2, 3, 3}, {2, 2, 2, 2}, {},
       [](const Tensor& x, const Tensor& w, const Tensor& b) {
         return conv_transpose2d(x, w, b, {1, 1}, {0, 0}, {1, 1}, 1, {2, 2});
       }},
  };
}

Tensor leaf(const Shape& s) { return random_tensor(s, DType::f64).requires_grad_(); }
Tensor maybe_leaf(const Shape& s) { return s.empty() ? Tensor() : leaf(s); }

// A copy of t (no history) with element i moved by delta.
Tensor nudged(const Tensor& t, int64_t i, double delta) {
  Tensor c = t.detach().clone();
  c.data_ptr<double>()[i] += delta;
  return c;
}

// sum(g * g) where g is the gradient of <conv(x, w, b), v> with respect to x (wrt_x) or w,
// computed first-order only: the value the penalty's own gradient is checked against.
double penalty(const ConvFn& fn, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& v, bool wrt_x) {
  const Tensor xr = x.detach().requires_grad_(), wr = w.detach().requires_grad_();
  const Tensor g = autograd::grad({fn(xr, wr, b.defined() ? b.detach() : Tensor())}, {wrt_x ? xr : wr}, {v})[0];
  return sum(g * g).item<double>();
}

// Central differences of penalty(...) in every element of the tensor g is not taken with
// respect to (w when wrt_x, else x), against `analytic`.
void expect_matches_differences(const ConvFn& fn, const Tensor& x, const Tensor& w, const Tensor& b,
                                const Tensor& v, bool wrt_x, const Tensor& analytic) {
  const double eps = 1e-6;
  ASSERT_TRUE(analytic.defined());
  const std::vector<double> a = analytic.to_vector<double>();
  const auto at = [&](int64_t i, double delta) {
    return wrt_x ? penalty(fn, x, nudged(w, i, delta), b, v, true) : penalty(fn, nudged(x, i, delta), w, b, v, false);
  };
  for (int64_t i = 0; i < int64_t(a.size()); ++i) {
    const double numeric = (at(i, eps) - at(i, -eps)) / (2 * eps);
    EXPECT_NEAR(a[size_t(i)], numeric, 1e-6 + 1e-5 * std::abs(numeric)) << (wrt_x ? "w[" : "x[") << i << "]";
  }
}

// Differentiates the penalty sum(g * g), g the gradient of <conv(x, w, b), v> with respect to
// x (wrt_x) or w, into the other one, and checks that against finite differences of the
// penalty. The gradient g depends on v and on that other tensor alone, so the one g is taken
// with respect to (and b) must get no gradient.
void expect_penalty_gradient(const ConvCase& c, bool wrt_x) {
  const Tensor x = leaf(c.x), w = leaf(c.w), b = maybe_leaf(c.b);
  const Tensor y = c.fn(x, w, b);
  const Tensor v = random_tensor(y.shape(), DType::f64);
  const Tensor g = autograd::grad({y}, {wrt_x ? x : w}, {v}, /*create_graph=*/true)[0];
  ASSERT_TRUE(g.requires_grad());
  sum(g * g).backward();
  expect_matches_differences(c.fn, x, w, b, v, wrt_x, wrt_x ? w.grad() : x.grad());
  EXPECT_FALSE((wrt_x ? x : w).grad().defined());
  if (b.defined()) {
    EXPECT_FALSE(b.grad().defined());
  }
}

}  // namespace

TEST(ConvDoubleBackward, GradgradcheckInF64) {
  for (const ConvCase& c : cases()) {
    SCOPED_TRACE(c.name);
    const GradcheckResult r = gradgradcheck(
        [&c](const std::vector<Tensor>& in) { return std::vector<Tensor>{c.fn(in[0], in[1], in[2])}; },
        {leaf(c.x), leaf(c.w), maybe_leaf(c.b)});
    EXPECT_TRUE(r.ok) << r.message;
  }
}

// WGAN-GP's penalty: the squared input gradient, differentiated into the weight.
TEST(ConvDoubleBackward, InputGradientPenaltyReachesTheWeight) {
  for (const ConvCase& c : cases()) {
    SCOPED_TRACE(c.name);
    expect_penalty_gradient(c, /*wrt_x=*/true);
  }
}

TEST(ConvDoubleBackward, WeightGradientPenaltyReachesTheInput) {
  for (const ConvCase& c : cases()) {
    SCOPED_TRACE(c.name);
    expect_penalty_gradient(c, /*wrt_x=*/false);
  }
}

// Two convolutions read x: under create_graph the two input gradients are summed by a recorded
// add, so the penalty on their sum reaches both weights.
TEST(ConvDoubleBackward, GradientsMeetingAtTheInputStayDifferentiable) {
  const Tensor x = leaf({2, 3, 6, 6}), w1 = leaf({4, 3, 3, 3}), w2 = leaf({2, 3, 2, 2});
  const Tensor v1 = random_tensor({2, 4, 3, 3}, DType::f64), v2 = random_tensor({2, 2, 6, 6}, DType::f64);
  const auto input_gradient = [&](const Tensor& a, const Tensor& b, bool create_graph) {
    const Tensor y1 = conv2d(x, a, Tensor(), {2, 2}, {1, 1}), y2 = conv2d(x, b, Tensor(), {1, 1}, "same");
    return autograd::grad({y1, y2}, {x}, {v1, v2}, create_graph)[0];
  };
  const Tensor gx = input_gradient(w1, w2, true);
  sum(gx * gx).backward();
  const double eps = 1e-6;
  const std::vector<double> a1 = w1.grad().to_vector<double>(), a2 = w2.grad().to_vector<double>();
  const auto value = [&](const Tensor& a, const Tensor& b) {
    const Tensor g = input_gradient(a.detach().requires_grad_(), b.detach().requires_grad_(), false);
    return sum(g * g).item<double>();
  };
  for (int64_t i = 0; i < w1.numel(); ++i) {
    const double numeric = (value(nudged(w1, i, eps), w2) - value(nudged(w1, i, -eps), w2)) / (2 * eps);
    EXPECT_NEAR(a1[size_t(i)], numeric, 1e-6 + 1e-5 * std::abs(numeric)) << "w1[" << i << "]";
  }
  for (int64_t i = 0; i < w2.numel(); ++i) {
    const double numeric = (value(w1, nudged(w2, i, eps)) - value(w1, nudged(w2, i, -eps))) / (2 * eps);
    EXPECT_NEAR(a2[size_t(i)], numeric, 1e-6 + 1e-5 * std::abs(numeric)) << "w2[" << i << "]";
  }
}

// create_graph changes what is recorded, not the values; an ordinary backward records nothing.
TEST(ConvDoubleBackward, FirstOrderValuesMatchTheOrdinaryBackward) {
  for (const ConvCase& c : cases()) {
    SCOPED_TRACE(c.name);
    const Tensor x = leaf(c.x), w = leaf(c.w), b = maybe_leaf(c.b);
    const Tensor v = random_tensor(c.fn(x, w, b).shape(), DType::f64);
    std::vector<Tensor> wrt = {x, w};
    if (b.defined()) wrt.push_back(b);
    const std::vector<Tensor> g = autograd::grad({c.fn(x, w, b)}, wrt, {v}, /*create_graph=*/true);
    c.fn(x, w, b).backward(v);
    // dx = dx(v, w) and dw = dw(v, x) have history; db = sum(v) has none, v being a constant.
    for (size_t i = 0; i < wrt.size(); ++i) {
      EXPECT_EQ(g[i].requires_grad(), i < 2) << i;
      EXPECT_FALSE(wrt[i].grad().requires_grad()) << i;
      EXPECT_EQ(g[i].to_vector<double>(), wrt[i].grad().to_vector<double>()) << i;
    }
  }
}
