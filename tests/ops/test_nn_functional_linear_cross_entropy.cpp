// linear_cross_entropy against the composition it replaces (linear, then cross_entropy over the
// rows) and against kernels/reference: the logits, the loss and the gradients of x, weight and
// bias, in f32 (bit for bit where both run the same arithmetic), f64 and bf16 under autocast,
// with ignored rows, an all-ignored batch, label smoothing, every reduction, a gradient that
// reaches the logits themselves, and 1 or 2 threads. When at most half the rows are scored, the
// backward's products run over the scored rows only: their bits are then those of the same
// products over those rows, and match the composition's to rounding.
#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>
#include <vector>

#include "core/autocast.h"
#include "kernels/reference/nn_functional.h"
#include "same_bits.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::random_tensor;
using ember::testing::same_bits;
using ember::testing::tolerance;
using ember::testing::uniform_int;
using ember::testing::with_one_and_two_threads;
namespace ref = ember::reference;

namespace {

struct Problem {
  Tensor x, weight, bias, target;
  int64_t ignore_index = -100;
  double smoothing = 0.0;
  Reduction reduction = Reduction::Mean;
};

// x [batch..., in] with one target per row, about `ignored` of them ignore_index.
Problem make_problem(const Shape& x_shape, int64_t classes, double ignored, DType dtype = DType::f32) {
  Problem p;
  const int64_t in = x_shape.back(), rows = numel_of(x_shape) / in;
  p.x = random_tensor(x_shape, dtype, false, -1, 1);
  p.weight = random_tensor({classes, in}, dtype, false, -1, 1);
  p.bias = random_tensor({classes}, dtype, false, -1, 1);
  std::vector<int64_t> t(static_cast<size_t>(rows));
  for (auto& v : t) v = double(uniform_int(0, 999)) < ignored * 1000 ? -100 : uniform_int(0, classes - 1);
  p.target = from_vector(t, {rows});
  return p;
}

struct Result {
  Tensor logits, loss, dx, dweight, dbias;
};

// The loss's gradient is `grad_loss` (a [rows] tensor for Reduction::None, else 1.5).
Tensor grad_of_loss(const Problem& p, DType dtype) {
  return p.reduction == Reduction::None ? random_tensor({p.target.numel()}, dtype, false, -1, 1)
                                        : scalar_tensor(1.5, {dtype});
}

template <typename Forward>
Result run(const Problem& p, const Tensor& grad_loss, bool autocast, const Forward& forward) {
  Tensor x = p.x.detach().requires_grad_(), w = p.weight.detach().requires_grad_();
  Tensor b = p.bias.detach().requires_grad_();
  Result r;
  {
    AutocastGuard guard(DeviceType::CPU, DType::bf16, autocast);
    std::tie(r.logits, r.loss) = forward(x, w, b);
  }
  r.loss.backward(grad_loss.to(r.loss.dtype()));
  r.dx = x.grad();
  r.dweight = w.grad();
  r.dbias = b.grad();
  return r;
}

Result fused(const Problem& p, const Tensor& grad_loss, bool autocast = false) {
  return run(p, grad_loss, autocast, [&](const Tensor& x, const Tensor& w, const Tensor& b) {
    return linear_cross_entropy(x, w, b, p.target, p.ignore_index, p.smoothing, p.reduction);
  });
}

Result composed(const Problem& p, const Tensor& grad_loss, bool autocast = false) {
  return run(p, grad_loss, autocast, [&](const Tensor& x, const Tensor& w, const Tensor& b) {
    Tensor logits = linear(x, w, b);
    Tensor loss = cross_entropy(logits.reshape({-1, w.size(0)}), p.target.reshape({-1}), p.ignore_index,
                                p.smoothing, p.reduction);
    return std::pair<Tensor, Tensor>{logits, loss};
  });
}

void expect_same_bits(const Tensor& got, const Tensor& want) {
  ASSERT_EQ(got.dtype(), want.dtype());
  EXPECT_TRUE(same_bits(got, want));
}

// Whether the backward takes the scored-rows path (at most half the rows scored).
bool scores_at_most_half(const Problem& p) {
  const auto t = p.target.to(DType::i64).to_vector<int64_t>();
  const auto scored = std::count_if(t.begin(), t.end(), [&](int64_t v) { return v != p.ignore_index; });
  return 2 * int64_t(scored) <= int64_t(t.size());
}

// The products' gradients: the same bits as the composition's on the all-rows path, the same
// to rounding on the scored-rows path (fewer terms per weight-gradient sum, other GEMM shapes).
void expect_product_grads_match(const Problem& p, const Result& f, const Result& c, double tol) {
  if (!scores_at_most_half(p)) {
    expect_same_bits(f.dx, c.dx);
    expect_same_bits(f.dweight, c.dweight);
    return;
  }
  EXPECT_TRUE(all_close(f.dx, c.dx, tol, tol));
  EXPECT_TRUE(all_close(f.dweight, c.dweight, tol, tol));
}

void expect_matches_reference(const Problem& p, const Tensor& grad_loss, const Result& r, double tol) {
  const auto rx = ref::from_tensor(p.x), rw = ref::from_tensor(p.weight), rb = ref::from_tensor(p.bias);
  const auto rt = ref::from_tensor(p.target);
  const auto want = ref::linear_cross_entropy(rx, rw, rb, true, rt, p.ignore_index, p.smoothing, p.reduction);
  EXPECT_TRUE(all_close(r.logits, want.logits, tol, tol));
  EXPECT_TRUE(all_close(r.loss, want.loss, tol, tol));
  const auto grads = ref::linear_cross_entropy_backward(rx, rw, rb, true, rt, ref::from_tensor(grad_loss),
                                                        p.ignore_index, p.smoothing, p.reduction);
  EXPECT_TRUE(all_close(r.dx, grads.dx, tol, tol));
  EXPECT_TRUE(all_close(r.dweight, grads.dweight, tol, tol));
  EXPECT_TRUE(all_close(r.dbias, grads.dbias, tol, tol));
}

}  // namespace

TEST(LinearCrossEntropy, F32MatchesCompositionBitForBitAndReference) {
  for (const Shape& x_shape : {Shape{5, 8}, Shape{2, 3, 16}, Shape{1, 4}, Shape{300, 12}}) {
    for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
      for (double smoothing : {0.0, 0.1}) {
        SCOPED_TRACE(::testing::Message() << "x " << shape_str(x_shape) << " reduction " << int(red) << " smoothing "
                                          << smoothing);
        Problem p = make_problem(x_shape, 37, 0.5);
        p.reduction = red;
        p.smoothing = smoothing;
        const Tensor g = grad_of_loss(p, DType::f32);
        const Result f = fused(p, g), c = composed(p, g);
        expect_same_bits(f.logits, c.logits);
        expect_same_bits(f.loss, c.loss);
        expect_product_grads_match(p, f, c, 1e-5);
        expect_same_bits(f.dbias, c.dbias);  // double column sums of the same f32 values, rounded once
        expect_matches_reference(p, g, f, 1e-4);
      }
    }
  }
}

TEST(LinearCrossEntropy, F64MatchesReference) {
  Problem p = make_problem({3, 4, 6}, 11, 0.3, DType::f64);
  p.smoothing = 0.2;
  const Tensor g = grad_of_loss(p, DType::f64);
  expect_matches_reference(p, g, fused(p, g), 1e-10);
}

TEST(LinearCrossEntropy, BertVocabularyBiasGradientIsTheColumnSumOfTheLogitGradient) {
  // The masked-LM head's shape with a narrow hidden size: 30522 classes, 85% of rows ignored,
  // more rows than one block of the bias sums.
  Problem p = make_problem({300, 8}, 30522, 0.85);
  const Tensor g = scalar_tensor(1.0);
  const Result f = fused(p, g);
  // The logits' gradient as cross_entropy writes it, summed per column in double.
  Tensor logits = linear(p.x, p.weight, p.bias).detach().requires_grad_();
  cross_entropy(logits, p.target).backward();
  const auto dl = logits.grad().to_vector<float>();
  std::vector<double> sums(30522, 0.0);
  for (size_t i = 0; i < dl.size(); ++i) sums[i % 30522] += double(dl[i]);
  const auto db = f.dbias.to_vector<float>();
  for (size_t j = 0; j < sums.size(); ++j) ASSERT_EQ(db[j], float(sums[j])) << "column " << j;
}

TEST(LinearCrossEntropy, ScoredRowsPathRunsTheProductsOverTheScoredRows) {
  // 85% ignored, as masked-LM losses are: the gradient of x is zero on ignored rows and the
  // product of the scored rows' logit gradient with the weight on the others; the weight
  // gradient is the product over the scored rows alone.
  for (Reduction red : {Reduction::Mean, Reduction::None}) {
    Problem p = make_problem({400, 24}, 3000, 0.85);
    p.reduction = red;
    ASSERT_TRUE(scores_at_most_half(p));
    const Tensor g = grad_of_loss(p, DType::f32);
    const Result f = fused(p, g);
    Tensor logits = linear(p.x, p.weight, p.bias).detach().requires_grad_();
    cross_entropy(logits, p.target, p.ignore_index, 0.0, red).backward(g);
    std::vector<int64_t> rows;
    const auto t = p.target.to_vector<int64_t>();
    for (size_t r = 0; r < t.size(); ++r)
      if (t[r] != p.ignore_index) rows.push_back(int64_t(r));
    const Tensor scored = from_vector(rows, {int64_t(rows.size())});
    const Tensor dlogits = index_select(logits.grad(), 0, scored);
    expect_same_bits(index_select(f.dx, 0, scored), matmul(dlogits, p.weight));
    expect_same_bits(f.dweight, matmul(dlogits.transpose(0, 1), index_select(p.x, 0, scored)));
    const auto dx = f.dx.to_vector<float>();
    for (size_t r = 0; r < t.size(); ++r) {
      if (t[r] != p.ignore_index) continue;
      for (int64_t j = 0; j < 24; ++j) ASSERT_EQ(dx[r * 24 + size_t(j)], 0.0f) << "row " << r;
    }
    expect_matches_reference(p, g, f, 1e-4);
  }
}

TEST(LinearCrossEntropy, Bf16UnderAutocastMatchesComposition) {
  for (Reduction red : {Reduction::Mean, Reduction::None}) {
    Problem p = make_problem({4, 32, 24}, 250, 0.85);
    p.reduction = red;
    const Tensor g = grad_of_loss(p, DType::f32);
    const Result f = fused(p, g, true), c = composed(p, g, true);
    EXPECT_EQ(f.logits.dtype(), DType::bf16);
    EXPECT_EQ(f.loss.dtype(), DType::f32);
    expect_same_bits(f.logits, c.logits);  // one bf16 rounding of the f32 sum, bias included
    expect_same_bits(f.loss, c.loss);
    expect_product_grads_match(p, f, c, tolerance(DType::bf16));
    // The composition sums the bf16-rounded logit gradient; the fused op the unrounded one.
    const double tol = tolerance(DType::bf16);
    EXPECT_TRUE(all_close(f.dbias, c.dbias, tol, tol));
    expect_matches_reference(p, g, f, 0.05);
  }
}

TEST(LinearCrossEntropy, AllIgnoredBatch) {
  Problem p = make_problem({6, 5}, 9, 1.0);
  for (Reduction red : {Reduction::Mean, Reduction::Sum}) {
    p.reduction = red;
    const Result f = fused(p, scalar_tensor(1.0));
    EXPECT_EQ(std::isnan(f.loss.item<double>()), red == Reduction::Mean);  // 0 / 0, as PyTorch
    for (const Tensor& grad : {f.dx, f.dweight, f.dbias})
      EXPECT_EQ(grad.to_vector<float>(), std::vector<float>(size_t(grad.numel()), 0.0f));
  }
}

TEST(LinearCrossEntropy, GradientThroughTheLogitsToo) {
  Problem p = make_problem({7, 6}, 13, 0.4);
  auto both = [&](bool use_fused) {
    Tensor x = p.x.detach().requires_grad_(), w = p.weight.detach().requires_grad_();
    Tensor b = p.bias.detach().requires_grad_();
    Tensor logits, loss;
    if (use_fused) {
      std::tie(logits, loss) = linear_cross_entropy(x, w, b, p.target);
    } else {
      logits = linear(x, w, b);
      loss = cross_entropy(logits, p.target);
    }
    (loss + sum(mul(logits, logits)) * 0.25).backward();
    return std::vector<Tensor>{x.grad(), w.grad(), b.grad()};
  };
  const auto f = both(true), c = both(false);
  for (size_t i = 0; i < f.size(); ++i) EXPECT_TRUE(all_close(f[i], c[i], 1e-5, 1e-6)) << "gradient " << i;
}

TEST(LinearCrossEntropy, SameBitsWhateverTheThreadCount) {
  // The loss and the bias gradient are the op's own sums; the products' bits are matmul's,
  // whose per-band path can change with the thread count on the small scored-rows products.
  for (double ignored : {0.3, 0.8}) {
    Problem p = make_problem({600, 16}, 999, ignored);
    // [loss, dbias..., dx..., dweight...]
    auto [one, two] = with_one_and_two_threads([&] {
      const Result f = fused(p, scalar_tensor(1.0));
      return cat({f.loss.reshape({1}), f.dbias, f.dx.reshape({-1}), f.dweight.reshape({-1})});
    });
    const auto a = one.to_vector<float>(), b = two.to_vector<float>();
    ASSERT_EQ(a.size(), b.size());
    const size_t own = 1 + 999;  // the loss and the bias gradient
    for (size_t i = 0; i < a.size(); ++i) {
      if (i < own || !scores_at_most_half(p)) {
        ASSERT_EQ(a[i], b[i]) << "element " << i;
      } else {
        ASSERT_NEAR(a[i], b[i], 1e-5 + 1e-5 * std::fabs(b[i])) << "element " << i;
      }
    }
  }
}

TEST(LinearCrossEntropy, Gradcheck) {
  Problem p = make_problem({2, 3, 4}, 5, 0.3, DType::f64);
  for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    ember::testing::expect_gradcheck(
        [&](const std::vector<Tensor>& in) -> std::vector<Tensor> {
          auto [logits, loss] = linear_cross_entropy(in[0], in[1], in[2], p.target, -100, 0.1, red);
          return {loss, logits};
        },
        {p.x.detach().requires_grad_(), p.weight.detach().requires_grad_(), p.bias.detach().requires_grad_()});
  }
}

TEST(LinearCrossEntropy, Errors) {
  Problem p = make_problem({4, 3}, 5, 0.0);
  EXPECT_THROW(linear_cross_entropy(p.x, p.weight, p.bias, from_vector<int64_t>({1, 2, 3})), Error);
  EXPECT_THROW(linear_cross_entropy(p.x, p.weight, p.bias, from_vector<int64_t>({1, 2, 3, 5})), Error);
  EXPECT_THROW(linear_cross_entropy(p.x, zeros({5, 4}), p.bias, p.target), Error);
}
