// Double backward (autograd::grad with create_graph) through softmax, log_softmax and the losses:
// gradgradcheck in f64 of softmax and log_softmax on every dim, of cross_entropy with each
// reduction, ignore_index, label smoothing and spatial or unbatched logits, and of the composed
// mse_loss; third derivatives of cross_entropy; its Hessian-vector product against the closed
// form diag(p) - p p^T; and first-order gradients under create_graph equal to an ordinary
// backward's, bit for bit, in f32 and f64.
#include <cmath>
#include <vector>

#include "double_backward_checks.h"
#include "nn/functional.h"

using namespace ember;
using ember::testing::DoubleBackwardCase;
using ember::testing::random_tensor;

namespace {

using In = std::vector<Tensor>;

// cross_entropy of in[0] against fixed class indices.
std::function<Tensor(const In&)> cross_entropy_of(Tensor target, int64_t ignore_index = -100, double smoothing = 0.0,
                                                  Reduction reduction = Reduction::Mean) {
  return [=](const In& in) { return cross_entropy(in[0], target, ignore_index, smoothing, reduction); };
}

std::vector<DoubleBackwardCase> loss_cases() {
  const Tensor rows = from_vector<int64_t>({2, 0, 3});                   // [3] classes of 4
  const Tensor with_ignored = from_vector<int64_t>({2, -100, 0, 1});     // one row ignored
  const Tensor spatial = from_vector<int64_t>({0, 2, 1, 2, -100, 0}, {2, 3});
  const Tensor unbatched = from_vector<int64_t>(std::vector<int64_t>{1}).reshape({});
  return {
      // softmax and log_softmax: the output feeds a product so its gradient reaches the input too
      {"softmax dim 1", {{{2, 4}}}, [](const In& in) { return softmax(in[0], 1); }},
      {"softmax dim 0", {{{3, 2}}}, [](const In& in) { return softmax(in[0], 0); }},
      {"softmax middle dim of 3", {{{2, 3, 2}}}, [](const In& in) { return softmax(in[0], -2); }},
      {"softmax 1-d", {{{5}}}, [](const In& in) { return mul(softmax(in[0], 0), in[0]); }},
      {"softmax 0-d", {{{}}}, [](const In& in) { return mul(softmax(in[0], 0), in[0]); }},
      {"log_softmax dim 1", {{{2, 4}}}, [](const In& in) { return log_softmax(in[0], 1); }},
      {"log_softmax dim 0", {{{3, 2}}}, [](const In& in) { return log_softmax(in[0], 0); }},
      {"log_softmax last dim of 3", {{{2, 2, 3}}}, [](const In& in) { return log_softmax(in[0], -1); }},
      {"log_softmax times input", {{{4}}}, [](const In& in) { return mul(log_softmax(in[0], 0), in[0]); }},
      // cross_entropy
      {"cross_entropy mean", {{{3, 4}}}, cross_entropy_of(rows)},
      {"cross_entropy sum", {{{3, 4}}}, cross_entropy_of(rows, -100, 0.0, Reduction::Sum)},
      {"cross_entropy none", {{{3, 4}}}, cross_entropy_of(rows, -100, 0.0, Reduction::None)},
      {"cross_entropy ignore_index mean", {{{4, 3}}}, cross_entropy_of(with_ignored)},
      {"cross_entropy ignore_index none", {{{4, 4}}}, cross_entropy_of(with_ignored, -100, 0.0, Reduction::None)},
      {"cross_entropy ignore_index in range", {{{3, 4}}}, cross_entropy_of(rows, /*ignore_index=*/0)},
      {"cross_entropy label smoothing", {{{3, 4}}}, cross_entropy_of(rows, -100, 0.2)},
      {"cross_entropy smoothing ignore sum", {{{4, 4}}}, cross_entropy_of(with_ignored, -100, 0.1, Reduction::Sum)},
      {"cross_entropy smoothing 1", {{{3, 4}}}, cross_entropy_of(rows, -100, 1.0)},
      {"cross_entropy spatial", {{{2, 3, 3}}}, cross_entropy_of(spatial)},
      {"cross_entropy spatial none", {{{2, 3, 3}}}, cross_entropy_of(spatial, -100, 0.1, Reduction::None)},
      {"cross_entropy unbatched", {{{4}}}, cross_entropy_of(unbatched)},
      {"cross_entropy of a product", {{{3, 2}}, {{4, 2}}},
       [rows](const In& in) { return cross_entropy(linear(in[0], in[1]), rows, -100, 0.1); }},
      // mse_loss is composed from differentiable ops: the input and the target both carry history
      {"mse_loss mean", {{{2, 3}}, {{2, 3}}}, [](const In& in) { return nn::functional::mse_loss(in[0], in[1]); }},
      {"mse_loss sum", {{{2, 3}}, {{2, 3}}},
       [](const In& in) { return nn::functional::mse_loss(in[0], in[1], Reduction::Sum); }},
      {"mse_loss none", {{{4}}, {{4}}},
       [](const In& in) { return nn::functional::mse_loss(in[0], in[1], Reduction::None); }},
  };
}

}  // namespace

TEST(DoubleBackwardLosses, GradgradcheckInF64) { ember::testing::expect_gradgradcheck_passes(loss_cases()); }

// The gradient of cross_entropy is itself differentiable twice: gradgradcheck of the gradient
// checks third derivatives through the second derivative's own formula.
TEST(DoubleBackwardLosses, ThirdDerivativesOfCrossEntropyAndLogSoftmax) {
  const Tensor target = from_vector<int64_t>({1, -100, 0});
  const auto gradient_of = [](const std::function<Tensor(const Tensor&)>& f) {
    return [f](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{autograd::grad({sum(f(in[0]))}, {in[0]}, {}, /*create_graph=*/true)[0]};
    };
  };
  const std::vector<Tensor> x = {random_tensor({3, 4}, DType::f64).requires_grad_()};
  const GradcheckResult ce = gradgradcheck(gradient_of([target](const Tensor& t) {
    return cross_entropy(t, target, -100, 0.1);
  }), x);
  EXPECT_TRUE(ce.ok) << ce.message;
  const GradcheckResult ls = gradgradcheck(gradient_of([](const Tensor& t) {
    return mul(log_softmax(t, 1), t);
  }), x);
  EXPECT_TRUE(ls.ok) << ls.message;
}

// One row of mean cross_entropy: its Hessian in the logits is diag(p) - p p^T, p = softmax(x),
// whatever the target.
TEST(DoubleBackwardLosses, CrossEntropyHessianVectorProductMatchesTheClosedForm) {
  const int64_t c = 5;
  const Tensor x = random_tensor({1, c}, DType::f64).requires_grad_();
  const Tensor v = random_tensor({1, c}, DType::f64);
  const Tensor g = autograd::grad({cross_entropy(x, from_vector<int64_t>({3}))}, {x}, {}, /*create_graph=*/true)[0];
  const std::vector<double> hv = autograd::grad({sum(mul(g, v))}, {x})[0].to_vector<double>();

  const std::vector<double> xs = x.to_vector<double>(), vs = v.to_vector<double>();
  double z = 0.0, pv = 0.0;
  for (double t : xs) z += std::exp(t);
  for (int64_t i = 0; i < c; ++i) pv += std::exp(xs[size_t(i)]) / z * vs[size_t(i)];
  for (int64_t i = 0; i < c; ++i) {
    const double p = std::exp(xs[size_t(i)]) / z;
    EXPECT_NEAR(hv[size_t(i)], p * vs[size_t(i)] - p * pv, 1e-12) << i;
  }
}

// The fused softmax and cross-entropy gradient kernels run with create_graph as without.
TEST(DoubleBackwardLosses, FirstOrderBitsMatchTheOrdinaryBackward) {
  ember::testing::expect_first_order_bits_match(loss_cases());
}
