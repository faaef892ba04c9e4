// Double backward (autograd::grad with create_graph) through the CPU linear_cross_entropy:
// gradgradcheck in f64 over x, weight and bias with every reduction, ignored rows, label
// smoothing, no bias, most rows ignored (the backward's scored-rows products), and with only some
// inputs requiring grad; first-order gradients under create_graph equal to an ordinary
// backward's, bit for bit, in f32 and f64 (the fused kernels stay the value); Hessian-vector
// products equal to those of linear followed by cross_entropy; and under bf16 autocast the
// first-order bits are kept and a second backward runs.
#include <functional>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "core/autocast.h"
#include "double_backward_checks.h"
#include "double_backward_op_cases.h"
#include "same_bits.h"
#include "test_util.h"

using namespace ember;
using ember::testing::DoubleBackwardCase;
using ember::testing::FusedCase;
using ember::testing::random_tensor;

namespace {

using In = std::vector<Tensor>;
using Fn = std::function<Tensor(const In&)>;

constexpr int64_t kIgnore = -100;

struct Loss {
  Tensor target;  // [2, 3]: x is [2, 3, 4], six rows of five classes
  double smoothing = 0.0;
  Reduction reduction = Reduction::Mean;
};

// Which inputs the case differentiates; the others are the fixed tensors below, in its dtype.
enum class Inputs { x_weight_bias, x_weight, x_only, weight_only, bias_only };

// x, weight and bias for the inputs a case does not differentiate, drawn once.
const In& fixed_operands() {
  static const In fixed = {random_tensor({2, 3, 4}, DType::f64), random_tensor({5, 4}, DType::f64),
                           random_tensor({5}, DType::f64)};
  return fixed;
}

// x, weight, bias (bias undefined for Inputs::x_weight) from the case's inputs and the fixed ones.
In operands(const In& in, Inputs which) {
  const In& f = fixed_operands();
  auto fixed = [&](size_t i) { return f[i].to(in[0].dtype()); };
  switch (which) {
    case Inputs::x_weight_bias: return {in[0], in[1], in[2]};
    case Inputs::x_weight: return {in[0], in[1], Tensor()};
    case Inputs::x_only: return {in[0], fixed(1), fixed(2)};
    case Inputs::weight_only: return {fixed(0), in[0], fixed(2)};
    case Inputs::bias_only: return {fixed(0), fixed(1), in[0]};
  }
  return {};
}

std::vector<ember::testing::InputSpec> specs(Inputs which) {
  switch (which) {
    case Inputs::x_weight_bias: return {{{2, 3, 4}}, {{5, 4}}, {{5}}};
    case Inputs::x_weight: return {{{2, 3, 4}}, {{5, 4}}};
    case Inputs::x_only: return {{{2, 3, 4}}};
    case Inputs::weight_only: return {{{5, 4}}};
    case Inputs::bias_only: return {{{5}}};
  }
  return {};
}

Fn fused(Loss loss, Inputs which) {
  return [=](const In& in) {
    const In o = operands(in, which);
    return linear_cross_entropy(o[0], o[1], o[2], loss.target, kIgnore, loss.smoothing, loss.reduction).second;
  };
}

// What it stands for: linear, then cross_entropy over the rows.
Fn composed(Loss loss, Inputs which) {
  return [=](const In& in) {
    const In o = operands(in, which);
    const Tensor logits = linear(o[0], o[1], o[2]).reshape({6, 5});
    return cross_entropy(logits, loss.target.reshape({6}), kIgnore, loss.smoothing, loss.reduction);
  };
}

FusedCase make_case(const std::string& name, Loss loss, Inputs which = Inputs::x_weight_bias) {
  return {{name, specs(which), fused(loss, which)}, composed(loss, which)};
}

std::vector<FusedCase> fused_cases() {
  const Tensor all = from_vector<int64_t>({1, 4, 0, 2, 3, 1}, {2, 3});
  const Tensor some_ignored = from_vector<int64_t>({1, kIgnore, 0, 2, kIgnore, 1}, {2, 3});
  // one row of six scored: the backward's products run over that row only
  const Tensor most_ignored = from_vector<int64_t>({kIgnore, kIgnore, 3, kIgnore, kIgnore, kIgnore}, {2, 3});
  return {
      make_case("mean", {all}),
      make_case("sum", {all, 0.0, Reduction::Sum}),
      make_case("none", {all, 0.0, Reduction::None}),
      make_case("ignored rows mean", {some_ignored}),
      make_case("ignored rows none", {some_ignored, 0.0, Reduction::None}),
      make_case("label smoothing mean", {all, 0.2}),
      make_case("label smoothing sum ignored rows", {some_ignored, 0.3, Reduction::Sum}),
      make_case("label smoothing none", {all, 0.1, Reduction::None}),
      make_case("no bias", {all, 0.1}, Inputs::x_weight),
      make_case("no bias ignored rows sum", {some_ignored, 0.0, Reduction::Sum}, Inputs::x_weight),
      make_case("most rows ignored mean", {most_ignored, 0.2}),
      make_case("most rows ignored none", {most_ignored, 0.0, Reduction::None}),
      make_case("most rows ignored no bias sum", {most_ignored, 0.1, Reduction::Sum}, Inputs::x_weight),
      make_case("most rows ignored x only", {most_ignored}, Inputs::x_only),
      make_case("x only", {all, 0.1}, Inputs::x_only),
      make_case("weight only", {some_ignored, 0.1}, Inputs::weight_only),
      make_case("bias only", {some_ignored, 0.2, Reduction::Sum}, Inputs::bias_only),
  };
}

std::vector<DoubleBackwardCase> cases() { return ember::testing::fused_ops_of(fused_cases()); }

}  // namespace

TEST(DoubleBackwardLinearCrossEntropy, GradgradcheckInF64) { ember::testing::expect_gradgradcheck_passes(cases()); }

// The fused backward kernels run with create_graph as without.
TEST(DoubleBackwardLinearCrossEntropy, FirstOrderBitsMatchTheOrdinaryBackward) {
  ember::testing::expect_first_order_bits_match(cases());
}

TEST(DoubleBackwardLinearCrossEntropy, HessianVectorProductsMatchLinearThenCrossEntropy) {
  ember::testing::expect_hessian_vector_products_match(fused_cases());
}

// A gradient penalty on x reaches x, the weight and the bias.
TEST(DoubleBackwardLinearCrossEntropy, GradientPenaltyReachesEveryInput) {
  const Tensor x = random_tensor({4, 3}, DType::f64).requires_grad_();
  const Tensor w = random_tensor({5, 3}, DType::f64).requires_grad_();
  const Tensor b = random_tensor({5}, DType::f64).requires_grad_();
  const Tensor target = from_vector<int64_t>({1, 4, kIgnore, 0});
  const Tensor loss = linear_cross_entropy(x, w, b, target, kIgnore, 0.1).second;
  const Tensor gx = autograd::grad({loss}, {x}, {}, /*create_graph=*/true)[0];
  const std::vector<Tensor> second = autograd::grad({sum(mul(gx, gx))}, {x, w, b});
  for (size_t i = 0; i < second.size(); ++i) {
    ASSERT_TRUE(second[i].defined()) << i;
    EXPECT_GT(sum(abs(second[i])).item<double>(), 0.0) << i;
  }
}

// Under bf16 autocast x and weight are lowered; create_graph keeps the first-order bits and the
// second backward reaches the f32 leaves through the lowering.
TEST(DoubleBackwardLinearCrossEntropy, AutocastKeepsFirstOrderBitsAndDifferentiatesAgain) {
  const Tensor x = random_tensor({6, 8}).requires_grad_();
  const Tensor w = random_tensor({7, 8}).requires_grad_();
  const Tensor b = random_tensor({7}).requires_grad_();
  const Tensor target = from_vector<int64_t>({1, 6, kIgnore, 0, 3, 2});
  AutocastGuard autocast(DeviceType::CPU, DType::bf16);
  auto loss = [&] { return linear_cross_entropy(x, w, b, target, kIgnore, 0.1).second; };
  const std::vector<Tensor> with_graph = autograd::grad({loss()}, {x, w, b}, {}, /*create_graph=*/true);
  const std::vector<Tensor> plain = autograd::grad({loss()}, {x, w, b});
  for (size_t i = 0; i < plain.size(); ++i) {
    ASSERT_TRUE(with_graph[i].requires_grad()) << i;
    EXPECT_TRUE(ember::testing::same_bits(with_graph[i], plain[i])) << i;
  }
  const std::vector<Tensor> second = autograd::grad({sum(mul(with_graph[0], with_graph[0]))}, {x, w, b});
  for (size_t i = 0; i < second.size(); ++i) {
    ASSERT_TRUE(second[i].defined()) << i;
    EXPECT_EQ(second[i].dtype(), DType::f32) << i;
    EXPECT_GT(sum(abs(second[i].to(DType::f64))).item<double>(), 0.0) << i;
  }
}

// The node keeps x, weight and bias for the composed formula, but an ordinary backward reads only
// what the fused one reads: a frozen bias changed in place after the forward still allows it,
// while a backward with create_graph, which recomputes the logits from it, refuses.
TEST(DoubleBackwardLinearCrossEntropy, AnOrdinaryBackwardReadsOnlyWhatTheFusedFormulaReads) {
  const Tensor x = random_tensor({4, 3}, DType::f64).requires_grad_();
  const Tensor w = random_tensor({5, 3}, DType::f64);
  const Tensor target = from_vector<int64_t>({1, 4, 2, 0});
  Tensor b = random_tensor({5}, DType::f64);
  const Tensor loss = linear_cross_entropy(x, w, b, target).second;
  const Tensor same_loss = linear_cross_entropy(x, w, b, target).second;
  b.mul_(2.0);
  EXPECT_TRUE(autograd::grad({loss}, {x})[0].defined());
  EXPECT_EMBER_ERROR(autograd::grad({same_loss}, {x}, {}, /*create_graph=*/true), "LinearCrossEntropyBackward",
                     "modified by an inplace operation");
}
