// Double backward (autograd::grad with create_graph) through the fused ops bias_gelu (exact and
// tanh forms), add_layer_norm (affine or not, broadcast residual, x bias, dropout, two normalised
// dims), scaled_masked_softmax (no mask, a learned broadcast mask, a constant -inf mask,
// dropout), scaled_dot_product_attention (broadcast batch, causal, additive and bool masks,
// dropout) and packed_self_attention (a mask, dropout): gradgradcheck of each in f64;
// first-order gradients under create_graph equal to an ordinary backward's, bit for bit, in f32
// and f64 (the fused kernels stay the value); and Hessian-vector products equal to those of the
// composition each op stands for.
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <vector>

#include "autograd/engine.h"
#include "double_backward_checks.h"
#include "double_backward_op_cases.h"
#include "test_util.h"

using namespace ember;
using ember::testing::DoubleBackwardCase;
using ember::testing::FusedCase;
using ember::testing::random_tensor;

namespace {

using In = std::vector<Tensor>;
using Fn = std::function<Tensor(const In&)>;

constexpr uint64_t kSeed = 4321;
constexpr double kScale = 0.7;

// Undefined where the case has no such input.
Tensor input_or_none(const In& in, size_t i) { return i < in.size() ? in[i] : Tensor(); }

// add_layer_norm over the last dim with the inputs {x, residual, weight, bias, x_bias} given;
// dropout draws from a fixed seed, so every call (and finite differences) sees one mask.
Fn add_layer_norm_of(const Shape& normalized_shape, double p) {
  return [=](const In& in) {
    manual_seed(kSeed);
    return add_layer_norm(in[0], in[1], normalized_shape, input_or_none(in, 2), input_or_none(in, 3), 1e-5, p,
                          /*training=*/true, input_or_none(in, 4));
  };
}

// What add_layer_norm stands for, with the same dropout mask.
Fn add_layer_norm_composed(const Shape& normalized_shape, double p) {
  return [=](const In& in) {
    manual_seed(kSeed);
    const Tensor x = in.size() > 4 ? add(in[0], in[4]) : in[0];
    return layer_norm(add(dropout(x, p, true), in[1]), normalized_shape, input_or_none(in, 2), input_or_none(in, 3),
                      1e-5);
  };
}

// scaled_masked_softmax of in[0] with mask in[1] (or `fixed_mask` when there is no in[1]).
Fn scaled_masked_softmax_of(double p, Tensor fixed_mask = Tensor()) {
  return [=](const In& in) {
    manual_seed(kSeed);
    const Tensor mask = in.size() > 1 ? in[1] : fixed_mask.defined() ? fixed_mask.to(in[0].dtype()) : Tensor();
    return scaled_masked_softmax(in[0], mask, kScale, p, /*training=*/true);
  };
}

Fn scaled_masked_softmax_composed(double p, Tensor fixed_mask = Tensor()) {
  return [=](const In& in) {
    manual_seed(kSeed);
    const Tensor mask = in.size() > 1 ? in[1] : fixed_mask.defined() ? fixed_mask.to(in[0].dtype()) : Tensor();
    Tensor s = mul(in[0], kScale);
    if (mask.defined()) s = add(s, mask);
    return dropout(softmax(s, -1), p, true);
  };
}

// [n, n] additive causal mask: 0 on and below the diagonal, -inf above it.
Tensor causal_mask(int64_t n) {
  std::vector<double> v(size_t(n * n), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = i + 1; j < n; ++j) v[size_t(i * n + j)] = -std::numeric_limits<double>::infinity();
  return from_vector(v, {n, n});
}

// scaled_dot_product_attention of in[0..2] with a constant mask (additive or bool, or undefined).
Fn attention_of(Tensor mask, double p, bool causal = false, std::optional<double> scale = std::nullopt) {
  return [=](const In& in) {
    manual_seed(kSeed);
    const Tensor m = mask.defined() && mask.is_floating_point() ? mask.to(in[0].dtype()) : mask;
    return scaled_dot_product_attention(in[0], in[1], in[2], m, p, causal, scale);
  };
}

// What it stands for, with the same dropout mask.
Fn attention_composed(Tensor mask, double p, bool causal = false, std::optional<double> scale = std::nullopt) {
  return [=](const In& in) {
    manual_seed(kSeed);
    const double s = scale ? *scale : 1.0 / std::sqrt(double(in[0].size(-1)));
    Tensor m = causal ? causal_mask(in[0].size(-2)) : mask;
    if (m.defined() && m.dtype() == DType::boolean)
      m = where(m, from_vector<double>({0.0}), from_vector<double>({-std::numeric_limits<double>::infinity()}));
    Tensor scores = mul(matmul(in[0], in[1].transpose(-2, -1)), s);
    if (m.defined()) scores = add(scores, m.to(in[0].dtype()));
    return matmul(dropout(softmax(scores, -1), p, true), in[2]);
  };
}

// packed_self_attention of in[0] [B, L, 12] (2 heads of 2) with a constant additive mask.
Fn packed_attention_of(Tensor mask, double p) {
  return [=](const In& in) {
    manual_seed(kSeed);
    return packed_self_attention(in[0], 2, mask.defined() ? mask.to(in[0].dtype()) : mask, p, /*training=*/true);
  };
}

Fn packed_attention_composed(Tensor mask, double p) {
  return [=](const In& in) {
    const int64_t b = in[0].size(0), len = in[0].size(1);
    auto head = [&](int64_t i) { return in[0].narrow(2, i * 4, 4).reshape({b, len, 2, 2}).transpose(1, 2); };
    const Tensor ctx = attention_composed(mask, p)({head(0), head(1), head(2)});
    return ctx.transpose(1, 2).reshape({b, len, 4});
  };
}

std::vector<FusedCase> fused_cases() {
  const Tensor causal = causal_mask(4);
  const Tensor scores_mask = random_tensor({3, 5}, DType::f64);
  const Tensor keys_taken = from_vector<bool>({true, false, true, true, false, false, true, true, true, true,
                                               true, true, false, true, false},
                                              {3, 5});
  const Fn gelu_exact = [](const In& in) { return gelu(add(in[0], in[1])); };
  const Fn gelu_tanh = [](const In& in) { return gelu(add(in[0], in[1]), /*tanh_approx=*/true); };
  return {
      // ---- bias + GELU
      {{"bias_gelu exact", {{{2, 3, 4}}, {{4}}}, [](const In& in) { return bias_gelu(in[0], in[1]); }}, gelu_exact},
      {{"bias_gelu tanh", {{{2, 3, 4}}, {{4}}}, [](const In& in) { return bias_gelu(in[0], in[1], true); }},
       gelu_tanh},
      {{"bias_gelu exact 2d", {{{5, 3}}, {{3}}}, [](const In& in) { return bias_gelu(in[0], in[1]); }}, gelu_exact},
      // ---- residual add + layer norm
      {{"add_layer_norm affine", {{{2, 3, 4}}, {{2, 3, 4}}, {{4}}, {{4}}}, add_layer_norm_of({4}, 0.0)},
       add_layer_norm_composed({4}, 0.0)},
      {{"add_layer_norm no affine", {{{3, 5}}, {{3, 5}}}, add_layer_norm_of({5}, 0.0)},
       add_layer_norm_composed({5}, 0.0)},
      {{"add_layer_norm broadcast residual", {{{2, 3, 4}}, {{3, 4}}, {{4}}, {{4}}}, add_layer_norm_of({4}, 0.0)},
       add_layer_norm_composed({4}, 0.0)},
      {{"add_layer_norm x bias", {{{3, 4}}, {{3, 4}}, {{4}}, {{4}}, {{4}}}, add_layer_norm_of({4}, 0.0)},
       add_layer_norm_composed({4}, 0.0)},
      {{"add_layer_norm dropout x bias", {{{4, 5}}, {{4, 5}}, {{5}}, {{5}}, {{5}}}, add_layer_norm_of({5}, 0.3)},
       add_layer_norm_composed({5}, 0.3)},
      {{"add_layer_norm dropout no affine", {{{2, 2, 4}}, {{2, 2, 4}}}, add_layer_norm_of({4}, 0.5)},
       add_layer_norm_composed({4}, 0.5)},
      {{"add_layer_norm two dims", {{{2, 2, 3}}, {{2, 2, 3}}, {{2, 3}}, {{2, 3}}, {{2, 3}}},
        add_layer_norm_of({2, 3}, 0.0)},
       add_layer_norm_composed({2, 3}, 0.0)},
      // ---- scale + mask + softmax
      {{"scaled_masked_softmax no mask", {{{2, 3, 5}}}, scaled_masked_softmax_of(0.0)},
       scaled_masked_softmax_composed(0.0)},
      {{"scaled_masked_softmax learned broadcast mask", {{{2, 3, 5}}, {{3, 5}}}, scaled_masked_softmax_of(0.0)},
       scaled_masked_softmax_composed(0.0)},
      {{"scaled_masked_softmax learned row mask", {{{2, 3, 4}}, {{2, 1, 4}}}, scaled_masked_softmax_of(0.0)},
       scaled_masked_softmax_composed(0.0)},
      {{"scaled_masked_softmax causal mask", {{{2, 4, 4}}}, scaled_masked_softmax_of(0.0, causal)},
       scaled_masked_softmax_composed(0.0, causal)},
      {{"scaled_masked_softmax dropout", {{{3, 6}}}, scaled_masked_softmax_of(0.3)},
       scaled_masked_softmax_composed(0.3)},
      {{"scaled_masked_softmax dropout learned mask", {{{2, 3, 5}}, {{5}}}, scaled_masked_softmax_of(0.4)},
       scaled_masked_softmax_composed(0.4)},
      // ---- attention (the fused kernels: CPU, a constant mask)
      {{"attention", {{{2, 3, 4}}, {{2, 5, 4}}, {{2, 5, 3}}}, attention_of(Tensor(), 0.0)},
       attention_composed(Tensor(), 0.0)},
      {{"attention broadcast batch", {{{2, 1, 3, 2}}, {{1, 2, 5, 2}}, {{1, 2, 5, 3}}}, attention_of(Tensor(), 0.0)},
       attention_composed(Tensor(), 0.0)},
      {{"attention causal scale", {{{1, 2, 4, 3}}, {{1, 2, 4, 3}}, {{1, 2, 4, 3}}},
        attention_of(Tensor(), 0.0, true, 0.4)},
       attention_composed(Tensor(), 0.0, true, 0.4)},
      {{"attention additive mask", {{{2, 3, 4}}, {{2, 5, 4}}, {{2, 5, 3}}}, attention_of(scores_mask, 0.0)},
       attention_composed(scores_mask, 0.0)},
      {{"attention bool mask", {{{2, 3, 4}}, {{2, 5, 4}}, {{2, 5, 3}}}, attention_of(keys_taken, 0.0)},
       attention_composed(keys_taken, 0.0)},
      {{"attention dropout", {{{2, 3, 4}}, {{2, 5, 4}}, {{2, 5, 3}}}, attention_of(Tensor(), 0.3)},
       attention_composed(Tensor(), 0.3)},
      {{"packed attention", {{{2, 3, 12}}}, packed_attention_of(Tensor(), 0.0)},
       packed_attention_composed(Tensor(), 0.0)},
      {{"packed attention mask", {{{2, 4, 12}}}, packed_attention_of(causal, 0.0)},
       packed_attention_composed(causal, 0.0)},
      {{"packed attention dropout", {{{1, 4, 12}}}, packed_attention_of(Tensor(), 0.3)},
       packed_attention_composed(Tensor(), 0.3)},
  };
}

std::vector<DoubleBackwardCase> cases() { return ember::testing::fused_ops_of(fused_cases()); }

}  // namespace

TEST(DoubleBackwardFused, GradgradcheckInF64) { ember::testing::expect_gradgradcheck_passes(cases()); }

// The fused backward kernels run with create_graph as without.
TEST(DoubleBackwardFused, FirstOrderBitsMatchTheOrdinaryBackward) {
  ember::testing::expect_first_order_bits_match(cases());
}

// The second derivatives are those of the composition each fused op stands for.
TEST(DoubleBackwardFused, HessianVectorProductsMatchTheComposition) {
  ember::testing::expect_hessian_vector_products_match(fused_cases());
}

// A second backward through the fused ops no longer stops at a first-order node.
TEST(DoubleBackwardFused, GradientPenaltyReachesEveryInput) {
  const Tensor x = random_tensor({3, 4}, DType::f64).requires_grad_();
  const Tensor bias = random_tensor({4}, DType::f64).requires_grad_();
  const Tensor residual = random_tensor({3, 4}, DType::f64).requires_grad_();
  const Tensor w = random_tensor({4}, DType::f64).requires_grad_();
  const Tensor h = add_layer_norm(bias_gelu(x, bias, true), residual, {4}, w, Tensor());
  const Tensor y = scaled_masked_softmax(h, Tensor(), 0.5);
  const std::vector<Tensor> g = autograd::grad({sum(mul(y, y))}, {x, bias, residual, w}, {}, /*create_graph=*/true);
  Tensor penalty = sum(mul(g[0], g[0]));
  for (size_t i = 1; i < g.size(); ++i) penalty = add(penalty, sum(mul(g[i], g[i])));
  const std::vector<Tensor> second = autograd::grad({penalty}, {x, bias, residual, w});
  for (size_t i = 0; i < second.size(); ++i) {
    ASSERT_TRUE(second[i].defined()) << i;
    EXPECT_GT(sum(abs(second[i])).item<double>(), 0.0) << i;
  }
}
