// Double backward through distributed::sync_batch_norm on a group of one rank, which takes the
// synchronised path (the layer itself falls back to BatchNorm there): gradgradcheck in f64,
// first-order gradients under create_graph equal to an ordinary backward's bit for bit, and
// Hessian-vector products equal to those of batch_norm in training, with the input, the affine
// parameters or both differentiated. tests/programs/syncbn_worker checks several ranks.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "distributed/hash_store.h"
#include "distributed/process_group.h"
#include "distributed/sync_batch_norm.h"
#include "double_backward_checks.h"
#include "test_util.h"

using namespace ember;
using ember::testing::FusedCase;
using ember::testing::InputSpec;
using ember::testing::random_tensor;

namespace {

using In = std::vector<Tensor>;

constexpr double kEps = 1e-3;  // large enough to matter in the second derivatives

const std::shared_ptr<distributed::ProcessGroup>& one_rank() {
  static const auto pg = distributed::new_process_group(std::make_shared<distributed::HashStore>(), 0, 1, "gloo");
  return pg;
}

// Which of x [N, C, *], weight and bias [C] a case differentiates; the others are fixed tensors.
enum class Inputs { all, x_only, no_affine, parameters_only };

struct Operands {
  Tensor x, weight, bias;
};

// x [3, 2, 4], weight and bias [2] for the inputs a case does not differentiate, drawn once.
const std::vector<Tensor>& fixed_operands() {
  static const std::vector<Tensor> fixed = {random_tensor({3, 2, 4}, DType::f64), random_tensor({2}, DType::f64),
                                            random_tensor({2}, DType::f64)};
  return fixed;
}

Operands operands(const In& in, Inputs which) {
  const auto fixed = [&](size_t i) { return fixed_operands()[i].to(in[0].dtype()); };
  switch (which) {
    case Inputs::all: return {in[0], in[1], in[2]};
    case Inputs::x_only: return {in[0], fixed(1), fixed(2)};
    case Inputs::no_affine: return {in[0], Tensor(), Tensor()};
    case Inputs::parameters_only: return {fixed(0), in[0], in[1]};
  }
  return {};
}

std::vector<InputSpec> specs(Inputs which, const Shape& x_shape) {
  const Shape c{x_shape[1]};
  switch (which) {
    case Inputs::all: return {{x_shape}, {c}, {c}};
    case Inputs::x_only:
    case Inputs::no_affine: return {{x_shape}};
    case Inputs::parameters_only: return {{c}, {c}};
  }
  return {};
}

// The output squared: batch norm is affine in its parameters, so their second derivatives reach
// the gradients' own backward only through a product.
Tensor squared(const Tensor& y) { return mul(y, y); }

FusedCase make_case(const std::string& name, const Shape& x_shape, Inputs which) {
  const auto sync = [=](const In& in) {
    const Operands o = operands(in, which);
    // running statistics are updated in place; the gradients do not read them
    const Tensor running_mean = zeros({x_shape[1]}, {in[0].dtype()}), running_var = ones({x_shape[1]}, {in[0].dtype()});
    return squared(
        distributed::sync_batch_norm(o.x, running_mean, running_var, o.weight, o.bias, 0.1, kEps, one_rank()));
  };
  const auto plain = [=](const In& in) {
    const Operands o = operands(in, which);
    return squared(batch_norm(o.x, Tensor(), Tensor(), o.weight, o.bias, /*training=*/true, 0.1, kEps));
  };
  return {{name, specs(which, x_shape), sync}, plain};
}

std::vector<FusedCase> fused_cases() {
  return {
      make_case("affine 3d", {4, 3, 2}, Inputs::all),
      make_case("affine 2d", {5, 3}, Inputs::all),
      make_case("affine 4d", {2, 3, 2, 2}, Inputs::all),
      make_case("no affine 4d", {2, 3, 2, 2}, Inputs::no_affine),
      make_case("x only", fixed_operands()[0].shape(), Inputs::x_only),
      make_case("parameters only", fixed_operands()[0].shape(), Inputs::parameters_only),
  };
}

}  // namespace

TEST(DoubleBackwardSyncBatchNorm, GradgradcheckInF64) {
  ember::testing::expect_gradgradcheck_passes(ember::testing::fused_ops_of(fused_cases()));
}

TEST(DoubleBackwardSyncBatchNorm, FirstOrderBitsMatchTheOrdinaryBackward) {
  ember::testing::expect_first_order_bits_match(ember::testing::fused_ops_of(fused_cases()));
}

TEST(DoubleBackwardSyncBatchNorm, HessianVectorProductsMatchBatchNorm) {
  ember::testing::expect_hessian_vector_products_match(fused_cases());
}

// WGAN-GP's gradient penalty, the sum over samples n of (||d loss / d x_n|| - 1)^2, differentiated
// into x, weight and bias, against batch norm's, for a loss whose gradient at the output depends
// on the output again. (||d loss / d x||^2 alone would not see a term of the x gradient constant
// over each channel, since batch norm's x gradient sums to zero over it.)
TEST(DoubleBackwardSyncBatchNorm, GradientPenaltyMatchesBatchNorm) {
  const Tensor x = random_tensor({4, 3, 2}, DType::f64).requires_grad_();
  const Tensor w = random_tensor({3}, DType::f64).requires_grad_(), b = random_tensor({3}, DType::f64).requires_grad_();
  const Tensor target = random_tensor({4, 3, 2}, DType::f64);
  const auto penalty_gradients = [&](const Tensor& y) {
    const Tensor gx = autograd::grad({sum(mul(tanh(y), target))}, {x}, {}, /*create_graph=*/true)[0];
    const Tensor norms = sqrt(sum(mul(gx, gx), {1, 2}));
    return autograd::grad({sum(pow(sub(norms, 1.0), 2.0))}, {x, w, b});
  };
  const In sync = penalty_gradients(distributed::sync_batch_norm(x, Tensor(), Tensor(), w, b, 0.1, kEps, one_rank()));
  const In plain = penalty_gradients(batch_norm(x, Tensor(), Tensor(), w, b, true, 0.1, kEps));
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(sync[i].defined()) << i;
    const std::vector<double> got = sync[i].to_vector<double>(), want = plain[i].to_vector<double>();
    for (size_t j = 0; j < got.size(); ++j)
      EXPECT_NEAR(got[j], want[j], 1e-9 * (1.0 + std::abs(want[j]))) << i << " " << j;
  }
}
