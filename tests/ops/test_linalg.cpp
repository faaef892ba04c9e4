// matmul, bmm and linear: forward against the double-precision reference over every rank
// combination, memory layout and dtype; backward through gradcheck; errors that name the op.
//
// Tolerances. Entry (i, j) of a product is a k-term dot product; its rounding error is bounded
// by a multiple of u * sum_p |a_ip| |b_pj| (u = unit roundoff), the multiple growing like
// sqrt(k) for independent rounding errors. So each entry is checked against
//   |got - want| <= (tol(out dtype) + tol(accumulation dtype) * sqrt(k)) * (|A| |B|)_ij
// where tol(f32) = 1e-5 (about 84 u) and the accumulation dtype is f32 for f16/bf16 (their
// products are accumulated in f32 and rounded once, so the output rounding dominates).
#include <cmath>
#include <functional>

#include "kernels/reference/linalg.h"
#include "linalg_check.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::kFloatTypes;
using ember::testing::Layout;
using ember::testing::layout_name;
using ember::testing::matmul_shapes;
using ember::testing::product_close;
using ember::testing::random_tensor;
using ember::testing::ref_abs;
using ember::testing::uniform_int;
using reference::RefTensor;

namespace {

::testing::AssertionResult matmul_matches_reference(const Tensor& a, const Tensor& b) {
  const RefTensor ra = reference::from_tensor(a), rb = reference::from_tensor(b);
  const Tensor got = ember::matmul(a, b);
  return product_close(got, reference::matmul(ra, rb), reference::matmul(ref_abs(ra), ref_abs(rb)), a.dtype(),
                       a.shape().back());
}

// Every layout but Misaligned (which only matters to a GPU's vector loads).
const Layout kLayouts[] = {Layout::Contiguous, Layout::Transposed,    Layout::Padded,       Layout::TransposedPadded,
                           Layout::Strided,    Layout::BatchPermuted, Layout::BatchExpanded};

// Strided operands come from random_tensor's own strided views; the rest from layout_operand.
Tensor operand(const Shape& shape, DType dtype, Layout layout) {
  if (layout == Layout::Strided) return random_tensor(shape, dtype, /*non_contiguous=*/true);
  return ember::testing::layout_operand(shape, dtype, layout, Device::cpu());
}

struct ThreadCount {
  explicit ThreadCount(int n) : saved(get_num_threads()) { set_num_threads(n); }
  ~ThreadCount() { set_num_threads(saved); }
  int saved;
};

}  // namespace

// ---- forward

TEST(Matmul, EveryRankCombinationLayoutAndDtypeMatchesReference) {
  for (int ra = 1; ra <= 4; ++ra)
    for (int rb = 1; rb <= 4; ++rb)
      for (DType dt : kFloatTypes)
        for (Layout la : kLayouts)
          for (int trial = 0; trial < 2; ++trial) {
            const auto [sa, sb] = matmul_shapes(ra, rb, 6, /*allow_zero=*/trial == 1);
            const Layout lb = kLayouts[uniform_int(0, 6)];
            const Tensor a = operand(sa, dt, la), b = operand(sb, dt, lb);
            EXPECT_TRUE(matmul_matches_reference(a, b))
                << shape_str(sa) << " (" << layout_name(la) << ") @ " << shape_str(sb) << " (" << layout_name(lb)
                << ") in " << dt;
          }
}

TEST(Matmul, ResultShapesFollowTorchMatmul) {
  EXPECT_EQ(matmul(ones({3}), ones({3})).shape(), Shape{});
  EXPECT_EQ(matmul(ones({2, 3}), ones({3})).shape(), (Shape{2}));
  EXPECT_EQ(matmul(ones({3}), ones({3, 4})).shape(), (Shape{4}));
  EXPECT_EQ(matmul(ones({5, 2, 3}), ones({3})).shape(), (Shape{5, 2}));
  EXPECT_EQ(matmul(ones({3}), ones({5, 3, 4})).shape(), (Shape{5, 4}));
  EXPECT_EQ(matmul(ones({7, 1, 2, 3}), ones({5, 3, 4})).shape(), (Shape{7, 5, 2, 4}));
  EXPECT_EQ(matmul(ones({0, 2, 3}), ones({3, 4})).shape(), (Shape{0, 2, 4}));
  // k = 0: every entry is an empty sum
  const Tensor z = matmul(ones({2, 0}), ones({0, 3}));
  EXPECT_EQ(z.to_vector<float>(), std::vector<float>(6, 0.0f));
  EXPECT_FLOAT_EQ(matmul(from_vector<float>({1, 2, 3}), from_vector<float>({4, 5, 6})).item<float>(), 32.0f);
}

// Sizes past Eigen's small-product cutoff, so the blocked, threaded GEMM runs, at 1 and 2 threads.
TEST(Matmul, GemmSizedProductsMatchReferenceAtOneAndTwoThreads) {
  for (int threads : {1, 2}) {
    ThreadCount tc(threads);
    for (DType dt : {DType::f32, DType::f64, DType::bf16})
      for (Layout la : kLayouts)
        for (Layout lb : {Layout::Contiguous, Layout::Transposed, Layout::TransposedPadded, Layout::BatchExpanded}) {
          const Shape sa = {uniform_int(1, 3), uniform_int(20, 70), uniform_int(30, 90)};
          const Shape sb = {sa[2], uniform_int(20, 70)};
          Shape sb3 = {sa[0], sb[0], sb[1]};
          EXPECT_TRUE(matmul_matches_reference(operand(sa, dt, la), operand(sb, dt, lb)))
              << threads << " threads, " << shape_str(sa) << " (" << layout_name(la) << ") @ " << shape_str(sb)
              << " (" << layout_name(lb) << ") in " << dt;
          EXPECT_TRUE(matmul_matches_reference(operand(sa, dt, la), operand(sb3, dt, lb)))
              << threads << " threads, " << shape_str(sa) << " (" << layout_name(la) << ") @ " << shape_str(sb3)
              << " (" << layout_name(lb) << ") in " << dt;
        }
    // many small batches (spread across threads) and few large ones (threaded GEMM each)
    EXPECT_TRUE(matmul_matches_reference(random_tensor({16, 9, 7}), random_tensor({16, 7, 5})));
    EXPECT_TRUE(matmul_matches_reference(random_tensor({3, 96, 80}), random_tensor({3, 80, 72})));
    EXPECT_TRUE(matmul_matches_reference(random_tensor({3, 96, 80}), random_tensor({1, 80, 72}).expand({3, 80, 72})));
    // one product split across threads by rows (m >= n) or by columns, each operand layout
    for (Layout la : {Layout::Contiguous, Layout::TransposedPadded})
      for (Layout lb : {Layout::Contiguous, Layout::TransposedPadded}) {
        EXPECT_TRUE(matmul_matches_reference(operand({300, 64}, DType::f32, la), operand({64, 40}, DType::f32, lb)));
        EXPECT_TRUE(matmul_matches_reference(operand({40, 64}, DType::f32, la), operand({64, 300}, DType::f32, lb)));
        EXPECT_TRUE(matmul_matches_reference(operand({97, 33}, DType::f64, la), operand({33, 301}, DType::f64, lb)));
      }
  }
}

TEST(Matmul, ThreadCountDoesNotChangeResultsBeyondRounding) {
  const Tensor a = random_tensor({4, 64, 200}), b = random_tensor({200, 96});
  Tensor one, two;
  {
    ThreadCount tc(1);
    one = matmul(a, b);
  }
  {
    ThreadCount tc(2);
    two = matmul(a, b);
  }
  EXPECT_TRUE(all_close(two, one, 1e-5, 1e-4));
}

TEST(Matmul, TransposedOperandsAreReadInPlace) {
  // A transposed view multiplies like its contiguous copy (the kernel maps it column-major).
  const Tensor w = random_tensor({48, 40});
  const Tensor x = random_tensor({3, 30, 40});
  const Tensor via_view = matmul(x, w.t());
  const Tensor via_copy = matmul(x, w.t().contiguous());
  EXPECT_TRUE(all_close(via_view, via_copy, 1e-6, 1e-5));
  EXPECT_EQ(via_view.shape(), (Shape{3, 30, 48}));
}

// Transposed, padded and batch-permuted operands reach the GEMM as they are: the only
// allocation is the output. An operand with no unit stride is copied once.
TEST(Matmul, BlasLayoutsAreNotCopied) {
  auto allocations = [](const std::function<Tensor()>& f) {
    const int64_t before = cpu_allocator().stats().num_allocations;
    const Tensor keep = f();
    return cpu_allocator().stats().num_allocations - before;
  };
  const Tensor x = random_tensor({3, 30, 40}), w = random_tensor({48, 40}), bias = random_tensor({48});
  const Tensor x_permuted = random_tensor({30, 3, 40}).transpose(0, 1);
  const Tensor w_padded_t = random_tensor({48, 45}).narrow(1, 2, 40).t();
  EXPECT_EQ(allocations([&] { return matmul(x, w.t()); }), 1);
  EXPECT_EQ(allocations([&] { return matmul(x_permuted, w.t()); }), 1);
  EXPECT_EQ(allocations([&] { return matmul(x, w_padded_t); }), 1);
  EXPECT_EQ(allocations([&] { return matmul(w, x.transpose(1, 2)); }), 1);
  EXPECT_EQ(allocations([&] { return linear(x, w, bias); }), 1);
  EXPECT_EQ(allocations([&] { return bmm(x, x.transpose(1, 2)); }), 1);
  const Tensor w_strided = random_tensor({48, 80}).slice(1, 0, 80, 2);
  EXPECT_EQ(allocations([&] { return matmul(x, w_strided.t()); }), 2);
}

TEST(Bmm, MatchesReference) {
  for (DType dt : kFloatTypes)
    for (Layout la : kLayouts)
      for (int trial = 0; trial < 3; ++trial) {
        const int64_t lo = trial == 2 ? 0 : 1, max_mat = trial == 1 ? 40 : 6;
        const Shape sa = {uniform_int(lo, 4), uniform_int(lo, max_mat), uniform_int(lo, max_mat)};
        const Shape sb = {sa[0], sa[2], uniform_int(lo, max_mat)};
        const Layout lb = kLayouts[uniform_int(0, 6)];
        const Tensor a = operand(sa, dt, la), b = operand(sb, dt, lb);
        const RefTensor ra = reference::from_tensor(a), rb = reference::from_tensor(b);
        EXPECT_TRUE(product_close(bmm(a, b), reference::bmm(ra, rb), reference::bmm(ref_abs(ra), ref_abs(rb)), dt,
                                  sa[2]))
            << shape_str(sa) << " (" << layout_name(la) << ") @ " << shape_str(sb) << " (" << layout_name(lb)
            << ") in " << dt;
      }
}

TEST(Linear, MatchesReferenceWithAndWithoutBias) {
  const Shape leading_shapes[] = {{}, {5}, {2, 7}, {0}, {3, 1, 4}};
  for (DType dt : kFloatTypes)
    for (const Shape& lead : leading_shapes)
      for (bool with_bias : {true, false})
        for (Layout lx : {Layout::Contiguous, Layout::Transposed, Layout::Strided, Layout::BatchPermuted})
          for (Layout lw : {Layout::Contiguous, Layout::Transposed}) {
            const int64_t in = uniform_int(1, 40), out = uniform_int(1, 40);
            Shape xs = lead;
            xs.push_back(in);
            const Tensor x = operand(xs, dt, lx), w = operand({out, in}, dt, lw);
            const Tensor b = with_bias ? random_tensor({out}, dt) : Tensor();
            const RefTensor rx = reference::from_tensor(x), rw = reference::from_tensor(w);
            const RefTensor rb = with_bias ? reference::from_tensor(b) : RefTensor();
            const RefTensor want = reference::linear(rx, rw, rb, with_bias);
            const RefTensor scale = reference::linear(ref_abs(rx), ref_abs(rw), ref_abs(rb), with_bias);
            EXPECT_TRUE(product_close(linear(x, w, b), want, scale, dt, in + 1))
                << "x " << shape_str(xs) << " (" << layout_name(lx) << "), w [" << out << ", " << in << "] ("
                << layout_name(lw) << "), bias " << with_bias << ", " << dt;
          }
}

TEST(Linear, EqualsMatmulWithTransposedWeightPlusBias) {
  const Tensor x = random_tensor({4, 6, 32}), w = random_tensor({24, 32}), b = random_tensor({24});
  const Tensor y = linear(x, w, b);
  const RefTensor want = reference::matmul(reference::from_tensor(x), reference::from_tensor(w.t()));
  const RefTensor rb = reference::from_tensor(b);
  RefTensor with_bias = want;
  for (int64_t i = 0; i < with_bias.numel(); ++i) with_bias.data[size_t(i)] += rb.data[size_t(i % 24)];
  EXPECT_TRUE(all_close(y, with_bias, 1e-5, 1e-4));
}

// ---- backward

TEST(MatmulGrad, GradcheckOverRankCombinations) {
  const std::pair<Shape, Shape> cases[] = {
      {{3}, {3}},          {{2, 3}, {3}},          {{3}, {3, 4}},          {{2, 3}, {3, 4}},
      {{2, 2, 3}, {3, 4}}, {{2, 3}, {2, 3, 4}},    {{2, 1, 2, 3}, {3, 3, 2}}, {{2, 2, 3}, {3}},
      {{3}, {2, 3, 2}},    {{1, 2, 3}, {2, 3, 2}}, {{2, 0, 3}, {3, 2}},     {{2, 3, 2}, {2, 2, 0}}};
  for (const auto& [sa, sb] : cases)
    for (bool non_contiguous : {false, true}) {
      const Tensor a = random_tensor(sa, DType::f64, non_contiguous).requires_grad_();
      const Tensor b = random_tensor(sb, DType::f64, non_contiguous).requires_grad_();
      auto r = gradcheck([](const std::vector<Tensor>& in) { return std::vector<Tensor>{matmul(in[0], in[1])}; },
                         {a, b});
      EXPECT_TRUE(r.ok) << shape_str(sa) << " @ " << shape_str(sb) << ": " << r.message;
    }
}

TEST(MatmulGrad, OnlyInputsThatNeedGradReceiveOne) {
  const Tensor a = random_tensor({2, 3, 4}, DType::f64).requires_grad_();
  const Tensor b = random_tensor({4, 5}, DType::f64);
  matmul(a, b).sum().backward();
  EXPECT_TRUE(a.grad().defined());
  EXPECT_FALSE(b.grad().defined());
  // d(sum(a b))/da = ones @ b^T: every row of the gradient holds the row sums of b.
  const RefTensor rb = reference::from_tensor(b);
  RefTensor want({2, 3, 4});
  for (int64_t i = 0; i < want.numel(); ++i) {
    const int64_t p = i % 4;
    for (int64_t j = 0; j < 5; ++j) want.data[size_t(i)] += rb.at({p, j});
  }
  EXPECT_TRUE(all_close(a.grad(), want, 1e-12, 1e-12));
}

TEST(BmmGrad, Gradcheck) {
  for (bool non_contiguous : {false, true}) {
    const Tensor a = random_tensor({2, 3, 4}, DType::f64, non_contiguous).requires_grad_();
    const Tensor b = random_tensor({2, 4, 2}, DType::f64, non_contiguous).requires_grad_();
    auto r = gradcheck([](const std::vector<Tensor>& in) { return std::vector<Tensor>{bmm(in[0], in[1])}; }, {a, b});
    EXPECT_TRUE(r.ok) << r.message;
  }
}

TEST(LinearGrad, Gradcheck) {
  const Shape x_shapes[] = {{4}, {3, 4}, {2, 3, 4}};
  for (const Shape& xs : x_shapes)
    for (bool with_bias : {true, false})
      for (bool non_contiguous : {false, true}) {
        const Tensor x = random_tensor(xs, DType::f64, non_contiguous).requires_grad_();
        const Tensor w = random_tensor({3, 4}, DType::f64, non_contiguous).requires_grad_();
        const Tensor b = with_bias ? random_tensor({3}, DType::f64).requires_grad_() : Tensor();
        auto r = gradcheck(
            [](const std::vector<Tensor>& in) { return std::vector<Tensor>{linear(in[0], in[1], in[2])}; },
            {x, w, b});
        EXPECT_TRUE(r.ok) << "x " << shape_str(xs) << ", bias " << with_bias << ": " << r.message;
      }
}

// At sizes that run the blocked GEMM: dx = g W, dW = g^T x, db = sum of g over rows.
TEST(LinearGrad, MatchesReferenceAtGemmSizes) {
  for (DType dt : {DType::f32, DType::f64}) {
    const Tensor x = random_tensor({2, 30, 40}, dt).requires_grad_();
    const Tensor w = random_tensor({50, 40}, dt).requires_grad_();
    const Tensor b = random_tensor({50}, dt).requires_grad_();
    const Tensor g = random_tensor({2, 30, 50}, dt);
    linear(x, w, b).backward(g);
    const RefTensor rx = reference::from_tensor(x), rw = reference::from_tensor(w), rg = reference::from_tensor(g);
    const RefTensor rg_rows = reference::from_tensor(g.reshape({60, 50}));
    const RefTensor want_dx = reference::matmul(rg, rw);
    const RefTensor want_dw = reference::matmul(reference::from_tensor(g.reshape({60, 50}).t()),
                                                reference::from_tensor(x.detach().reshape({60, 40})));
    RefTensor want_db({50});
    for (int64_t i = 0; i < rg_rows.numel(); ++i) want_db.data[size_t(i % 50)] += rg_rows.data[size_t(i)];
    const double tol = dt == DType::f32 ? 1e-4 : 1e-10;
    EXPECT_TRUE(all_close(x.grad(), want_dx, tol, tol)) << dt;
    EXPECT_TRUE(all_close(w.grad(), want_dw, tol, tol)) << dt;
    EXPECT_TRUE(all_close(b.grad(), want_db, tol, tol)) << dt;
  }
}

TEST(Matmul, TensorMemberMatchesFreeFunction) {
  const Tensor a = random_tensor({3, 4}), b = random_tensor({4, 2});
  EXPECT_TRUE(all_close(a.matmul(b), matmul(a, b), 0.0, 0.0));
}

// ---- errors

TEST(LinalgErrors, NameTheOpAndTheShapes) {
  EXPECT_EMBER_ERROR(matmul(zeros({32, 64}), zeros({128, 10})),
                     "matmul: shapes [32, 64] and [128, 10] cannot be multiplied (64 != 128)");
  EXPECT_EMBER_ERROR(matmul(zeros({3}), zeros({4})), "matmul", "[3]", "[4]", "3 != 4");
  EXPECT_EMBER_ERROR(matmul(zeros({2, 3, 4}), zeros({5})), "matmul", "[2, 3, 4]", "[5]", "4 != 5");
  EXPECT_EMBER_ERROR(matmul(scalar_tensor(1.0), zeros({3})), "matmul", "at least 1 dimension", "[]", "[3]");
  EXPECT_EMBER_ERROR(matmul(zeros({3}), scalar_tensor(1.0)), "matmul", "at least 1 dimension");
  EXPECT_EMBER_ERROR(matmul(zeros({2, 3, 4}), zeros({3, 4, 5})), "matmul", "batch dimensions", "[2]", "[3]",
                     "[2, 3, 4]", "[3, 4, 5]");
  EXPECT_EMBER_ERROR(matmul(zeros({2, 3}), zeros({3, 4}, {DType::f64})), "matmul", "same dtype", "float32",
                     "float64");
  EXPECT_EMBER_ERROR(matmul(zeros({2, 3}, {DType::i64}), zeros({3, 4}, {DType::i64})), "matmul",
                     "floating-point", "int64");
  EXPECT_EMBER_ERROR(matmul(Tensor(), zeros({3})), "matmul", "undefined");

  EXPECT_EMBER_ERROR(bmm(zeros({3, 4}), zeros({4, 5})), "bmm", "3-D", "[3, 4]", "[4, 5]");
  EXPECT_EMBER_ERROR(bmm(zeros({2, 3, 4}), zeros({3, 4, 5})), "bmm", "batch sizes", "2 != 3");
  EXPECT_EMBER_ERROR(bmm(zeros({2, 3, 4}), zeros({2, 5, 6})), "bmm", "[2, 3, 4]", "[2, 5, 6]", "4 != 5");
  EXPECT_EMBER_ERROR(bmm(zeros({2, 3, 4}), zeros({2, 4, 5}, {DType::bf16})), "bmm", "same dtype", "bfloat16");

  EXPECT_EMBER_ERROR(linear(zeros({2, 3}), zeros({4, 5})), "linear", "[2, 3]", "[4, 5]", "3 != 5");
  EXPECT_EMBER_ERROR(linear(zeros({2, 3}), zeros({3})), "linear", "weight must be 2-D", "[3]");
  EXPECT_EMBER_ERROR(linear(scalar_tensor(1.0), zeros({4, 3})), "linear", "at least 1 dimension");
  EXPECT_EMBER_ERROR(linear(zeros({2, 3}), zeros({4, 3}), zeros({5})), "linear", "bias of shape [5]", "[4, 3]",
                     "expected [4]");
  EXPECT_EMBER_ERROR(linear(zeros({2, 3}), zeros({4, 3}), zeros({1, 4})), "linear", "bias of shape [1, 4]");
  EXPECT_EMBER_ERROR(linear(zeros({2, 3}), zeros({4, 3}), zeros({4}, {DType::f64})), "linear", "same dtype");
  EXPECT_EMBER_ERROR(linear(zeros({2, 3}, {DType::f16}), zeros({4, 3})), "linear", "same dtype", "float16");
}
