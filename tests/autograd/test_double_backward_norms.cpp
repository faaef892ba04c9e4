// Double backward (autograd::grad with create_graph) through the normalizations (layer, RMS,
// group, and batch norm in training and evaluation), the poolings, dropout, embedding and the
// indexing ops: gradgradcheck of each in f64; first-order gradients under create_graph equal to
// an ordinary backward's, bit for bit, in f32 and f64 (their fused kernels stay the value); and
// a gradient penalty through small LayerNorm and BatchNorm networks against finite differences
// of the penalty.
#include <cmath>
#include <functional>
#include <vector>

#include "autograd/engine.h"
#include "double_backward_checks.h"
#include "double_backward_op_cases.h"
#include "test_util.h"

using namespace ember;
using ember::testing::DoubleBackwardCase;
using ember::testing::random_tensor;
using ember::testing::squared;

namespace {

using In = std::vector<Tensor>;

Tensor indices(const std::vector<int64_t>& values, const Shape& shape) { return from_vector(values, shape); }

// Fixed running statistics of 3 channels for batch norm in evaluation.
Tensor running_mean() { return from_vector<double>({0.3, -0.2, 0.1}); }
Tensor running_var() { return from_vector<double>({0.8, 1.5, 0.6}); }

// dropout with the same mask on every call, so finite differences see one function.
Tensor seeded_dropout(const Tensor& x, double p) {
  manual_seed(1234);
  return dropout(x, p, /*training=*/true);
}

// The cases, inputs in the order of their InputSpecs: x first, then the affine weight and bias
// where there are some. The linear ops sit inside a square or a tanh, so their second derivative
// reaches their gradient's own backward.
std::vector<DoubleBackwardCase> cases() {
  const Tensor rm = running_mean(), rv = running_var();
  const Tensor select_index = indices({2, 0, 2, 3}, {4});
  const Tensor gather_index = indices({1, 0, 2, 2, 0, 1}, {2, 3});
  const Tensor scatter_index = indices({3, 0, 3, 1}, {2, 2});
  const Tensor embedding_index = indices({0, 1, 4, 1, 2, 4}, {2, 3});
  return {
      // ---- normalizations
      {"layer_norm affine", {{{2, 3, 4}}, {{4}}, {{4}}},
       [](const In& in) { return layer_norm(in[0], {4}, in[1], in[2]); }},
      {"layer_norm two dims affine", {{{3, 2, 3}}, {{2, 3}}, {{2, 3}}},
       [](const In& in) { return layer_norm(in[0], {2, 3}, in[1], in[2]); }},
      {"layer_norm no affine", {{{3, 5}}}, [](const In& in) { return layer_norm(in[0], {5}); }},
      {"layer_norm whole input", {{{2, 3}}}, [](const In& in) { return layer_norm(in[0], {2, 3}); }},
      {"rms_norm weight", {{{3, 4}}, {{4}}}, [](const In& in) { return rms_norm(in[0], {4}, in[1], 1e-5); }},
      {"rms_norm no weight", {{{2, 2, 3}}}, [](const In& in) { return rms_norm(in[0], {2, 3}, Tensor(), 1e-5); }},
      {"group_norm affine", {{{2, 4, 3}}, {{4}}, {{4}}},
       [](const In& in) { return group_norm(in[0], 2, in[1], in[2]); }},
      {"group_norm 4d no affine", {{{2, 6, 2, 2}}}, [](const In& in) { return group_norm(in[0], 3); }},
      {"group_norm 2d one group", {{{3, 4}}, {{4}}, {{4}}},
       [](const In& in) { return group_norm(in[0], 1, in[1], in[2]); }},
      {"batch_norm training affine", {{{4, 3, 2}}, {{3}}, {{3}}},
       [](const In& in) { return batch_norm(in[0], Tensor(), Tensor(), in[1], in[2], true); }},
      {"batch_norm training 4d no affine", {{{2, 3, 2, 2}}},
       [](const In& in) { return batch_norm(in[0], Tensor(), Tensor(), Tensor(), Tensor(), true); }},
      {"batch_norm training 2d", {{{5, 3}}, {{3}}, {{3}}},
       [](const In& in) { return batch_norm(in[0], Tensor(), Tensor(), in[1], in[2], true); }},
      // affine in x: the square makes its second derivative nonzero
      {"batch_norm eval affine", {{{2, 3, 2}}, {{3}}, {{3}}},
       [rm, rv](const In& in) {
         const Tensor y = batch_norm(in[0], rm.to(in[0].dtype()), rv.to(in[0].dtype()), in[1], in[2], false);
         return mul(y, y);
       }},
      // ---- pooling
      {"max_pool2d overlapping windows", {{{1, 2, 5, 5}}},
       squared([](const Tensor& x) { return max_pool2d(x, {3, 3}, {2, 2}); })},
      {"max_pool2d padding dilation ceil", {{{2, 1, 6, 5}}},
       squared([](const Tensor& x) { return max_pool2d(x, {2, 3}, {2, 1}, {1, 1}, {2, 1}, true); })},
      {"max_pool2d unbatched", {{{2, 4, 4}}}, squared([](const Tensor& x) { return max_pool2d(x, {2, 2}); })},
      {"avg_pool2d padding", {{{1, 2, 5, 4}}},
       squared([](const Tensor& x) { return avg_pool2d(x, {3, 2}, {2, 1}, {1, 1}); })},
      {"avg_pool2d ceil without pad count", {{{2, 1, 5, 5}}},
       squared([](const Tensor& x) { return avg_pool2d(x, {2, 2}, {2, 2}, {1, 0}, true, false); })},
      {"adaptive_avg_pool2d", {{{1, 2, 5, 7}}},
       squared([](const Tensor& x) { return adaptive_avg_pool2d(x, {3, 4}); })},
      // ---- dropout and embedding
      {"dropout", {{{3, 4}}}, squared([](const Tensor& x) { return seeded_dropout(x, 0.4); })},
      {"dropout everything", {{{3}}}, [](const In& in) { return add(seeded_dropout(in[0], 1.0), mul(in[0], in[0])); }},
      {"embedding padding_idx", {{{5, 3}}},
       [embedding_index](const In& in) { return tanh(embedding(in[0], embedding_index, 1)); }},
      {"embedding", {{{5, 2}}}, squared([embedding_index](const Tensor& w) { return embedding(w, embedding_index); })},
      // ---- indexing
      {"index_select", {{{4, 3}}},
       squared([select_index](const Tensor& x) { return index_select(x, 0, select_index); })},
      {"index_select last dim", {{{2, 4}}},
       [select_index](const In& in) { return tanh(index_select(in[0], 1, select_index)); }},
      {"gather", {{{3, 3}}}, squared([gather_index](const Tensor& x) { return gather(x, 1, gather_index); })},
      {"scatter_add src larger than index", {{{4, 3}}, {{3, 3}}},
       [scatter_index](const In& in) { return tanh(scatter_add(in[0], 0, scatter_index, in[1])); }},
  };
}

Tensor leaf(const Shape& s) { return random_tensor(s, DType::f64).requires_grad_(); }

// A copy of t (no history) with element i moved by delta.
Tensor nudged(const Tensor& t, int64_t i, double delta) {
  Tensor c = t.detach().clone();
  c.data_ptr<double>()[i] += delta;
  return c;
}

// linear -> a normalization -> tanh -> linear, one score per row; p = {w1, b1, gamma, beta, w2}.
Tensor norm_critic(const std::vector<Tensor>& p, const Tensor& x, bool batch_norm_layer) {
  const Tensor h = linear(x, p[0], p[1]);
  const Tensor n = batch_norm_layer ? batch_norm(h, Tensor(), Tensor(), p[2], p[3], /*training=*/true)
                                    : layer_norm(h, {h.size(1)}, p[2], p[3]);
  return linear(tanh(n), p[4]);
}

// WGAN-GP: mean over rows of (||d sum(critic) / dx||_2 - 1)^2. Through batch norm the rows'
// scores depend on each other, so the gradient is that of the summed score.
Tensor gradient_penalty(const std::vector<Tensor>& params, const Tensor& x_in, bool batch_norm_layer,
                        bool create_graph) {
  const Tensor x = x_in.detach().requires_grad_();
  const Tensor score = norm_critic(params, x, batch_norm_layer);
  const Tensor g = autograd::grad({sum(score)}, {x}, {}, create_graph)[0];
  return mean(pow(sub(sqrt(sum(mul(g, g), {1})), 1.0), 2.0));
}

void expect_penalty_gradient_matches_differences(bool batch_norm_layer) {
  const int64_t batch = 4, features = 3, hidden = 5;
  const std::vector<Tensor> params = {leaf({hidden, features}), leaf({hidden}), leaf({hidden}), leaf({hidden}),
                                      leaf({1, hidden})};
  const char* names[] = {"w1", "b1", "gamma", "beta", "w2"};
  const Tensor x = random_tensor({batch, features}, DType::f64);
  gradient_penalty(params, x, batch_norm_layer, /*create_graph=*/true).backward();

  const double eps = 1e-6;
  for (size_t p = 0; p < params.size(); ++p) {
    const Tensor analytic = params[p].grad();
    ASSERT_TRUE(analytic.defined()) << names[p];
    const std::vector<double> a = analytic.to_vector<double>();
    for (int64_t i = 0; i < int64_t(a.size()); ++i) {
      const auto at = [&](double delta) {
        std::vector<Tensor> moved = params;
        moved[p] = nudged(params[p], i, delta);
        return gradient_penalty(moved, x, batch_norm_layer, false).item<double>();
      };
      const double numeric = (at(eps) - at(-eps)) / (2 * eps);
      EXPECT_NEAR(a[size_t(i)], numeric, 1e-6 + 1e-5 * std::abs(numeric)) << names[p] << "[" << i << "]";
    }
  }
}

}  // namespace

TEST(DoubleBackwardNorms, GradgradcheckInF64) {
  ember::testing::expect_gradgradcheck_passes(cases());
}

// The fused backward kernels run under create_graph too: their values are the gradients.
TEST(DoubleBackwardNorms, FirstOrderBitsMatchTheOrdinaryBackward) {
  ember::testing::expect_first_order_bits_match(cases());
}

// The normalizations' gradients without the square around them: the fused kernel's value comes
// with the history of the composed gradient, so a second backward reaches x, weight and bias.
TEST(DoubleBackwardNorms, LayerNormInputGradientDependsOnTheWeight) {
  const Tensor x = leaf({3, 4}), w = leaf({4}), b = leaf({4});
  const Tensor v = random_tensor({3, 4}, DType::f64);
  const Tensor gx = autograd::grad({layer_norm(x, {4}, w, b)}, {x}, {v}, /*create_graph=*/true)[0];
  ASSERT_TRUE(gx.requires_grad());
  const std::vector<Tensor> second = autograd::grad({sum(mul(gx, gx))}, {x, w, b});
  ASSERT_TRUE(second[0].defined());
  ASSERT_TRUE(second[1].defined());
  // dx does not depend on the bias
  EXPECT_FALSE(second[2].defined());
}

TEST(DoubleBackwardNorms, LayerNormGradientPenaltyMatchesFiniteDifferences) {
  expect_penalty_gradient_matches_differences(/*batch_norm_layer=*/false);
}

TEST(DoubleBackwardNorms, BatchNormGradientPenaltyMatchesFiniteDifferences) {
  expect_penalty_gradient_matches_differences(/*batch_norm_layer=*/true);
}

// Pooling's gradients are linear maps whose own gradients are the forwards, to any order. With
// y = pool(x) and f = sum(y^3) / 6, the gradient of the sum of the gradient of the sum of f's
// gradient is the pooling's adjoint applied to ones: 1 at each window's maximum for max pooling,
// 1/4 over each 2x2 window for average pooling.
TEST(DoubleBackwardNorms, PoolingThirdDerivative) {
  const Tensor x = leaf({1, 1, 4, 4});
  const auto third = [&](const std::function<Tensor(const Tensor&)>& pool) {
    const Tensor y = pool(x);
    const Tensor g1 = autograd::grad({mul(sum(mul(mul(y, y), y)), 1.0 / 6.0)}, {x}, {}, true)[0];
    const Tensor g2 = autograd::grad({sum(g1)}, {x}, {}, true)[0];
    return autograd::grad({sum(g2)}, {x})[0];
  };
  // max pool with disjoint windows: 1 at each window's maximum, 0 elsewhere
  const std::vector<double> xs = x.to_vector<double>();
  const std::vector<double> got = third([](const Tensor& t) { return max_pool2d(t, {2, 2}); }).to_vector<double>();
  for (int64_t oh = 0; oh < 2; ++oh) {
    for (int64_t ow = 0; ow < 2; ++ow) {
      int64_t best = -1;
      for (int64_t kh = 0; kh < 2; ++kh)
        for (int64_t kw = 0; kw < 2; ++kw) {
          const int64_t i = (2 * oh + kh) * 4 + 2 * ow + kw;
          if (best < 0 || xs[size_t(i)] > xs[size_t(best)]) best = i;
        }
      for (int64_t kh = 0; kh < 2; ++kh)
        for (int64_t kw = 0; kw < 2; ++kw) {
          const int64_t i = (2 * oh + kh) * 4 + 2 * ow + kw;
          EXPECT_EQ(got[size_t(i)], i == best ? 1.0 : 0.0) << i;
        }
    }
  }
  for (double v : third([](const Tensor& t) { return avg_pool2d(t, {2, 2}); }).to_vector<double>())
    EXPECT_NEAR(v, 0.25, 1e-15);
}
