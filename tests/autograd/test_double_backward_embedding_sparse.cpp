// Double backward (autograd::grad with create_graph) through embedding's row-sparse gradient: a
// table flagged with set_row_sparse_grad (torch's sparse=True) or looked up through
// embedding_with_row_sparse_backward (nn::Embedding::row_sparse_backward). autograd::grad
// returns the table's gradient dense, differentiable under create_graph; an ordinary backward
// still leaves rows. Checked: gradgradcheck in f64 (repeated indices, a padding row, a tied
// decoder, a second input); first-order gradients under create_graph equal to the rows an
// ordinary backward leaves, bit for bit; Hessian-vector products and a gradient penalty equal
// to those of the dense embedding, to 1e-9 in f64.
#include <cmath>
#include <functional>
#include <optional>
#include <vector>

#include "autograd/engine.h"
#include "core/sparse_grad.h"
#include "double_backward_checks.h"
#include "double_backward_op_cases.h"
#include "same_bits.h"
#include "test_util.h"

using namespace ember;
using ember::testing::DoubleBackwardCase;
using ember::testing::FusedCase;
using ember::testing::InputSpec;
using ember::testing::random_tensor;

namespace {

using In = std::vector<Tensor>;
using Lookup = std::function<Tensor(const Tensor& table, const Tensor& indices, std::optional<int64_t> pad)>;

constexpr int64_t kRows = 7, kDim = 3;

// Repeats (rows 2 and 5 three times), the padding row 0 twice, rows 1, 4 and 6 never read.
Tensor indices() { return from_vector<int64_t>({2, 5, 0, 2, 3, 5, 2, 0, 5}, {3, 3}); }

// The two ways a lookup leaves rows: the table's flag, and the lookup's own.
Tensor flagged_lookup(const Tensor& table, const Tensor& idx, std::optional<int64_t> pad) {
  Tensor t = table;
  t.set_row_sparse_grad();
  return embedding(t, idx, pad);
}
Tensor row_sparse_lookup(const Tensor& table, const Tensor& idx, std::optional<int64_t> pad) {
  return embedding_with_row_sparse_backward(table, idx, pad);
}
Tensor dense_lookup(const Tensor& table, const Tensor& idx, std::optional<int64_t> pad) {
  return embedding(table, idx, pad);
}

// Every case's gradient in the table depends on the table, so the second derivative reaches
// both the lookup and the gradient's own backward.
std::vector<DoubleBackwardCase> cases_with(const Lookup& lookup, const std::string& tag) {
  const InputSpec table{{kRows, kDim}};
  return {
      {tag + " squared", {table},
       [=](const In& in) {
         const Tensor e = lookup(in[0], indices(), std::nullopt);
         return mul(e, e);
       }},
      {tag + " squared, padding row 0", {table},
       [=](const In& in) {
         const Tensor e = lookup(in[0], indices(), 0);
         return mul(e, e);
       }},
      // No padding row here: the lookup reads it, so the second input's gradient depends on it,
      // which the padding row's zero gradient (torch's rule, not a derivative) does not say.
      {tag + " tanh times a second input", {table, InputSpec{{3, 3, kDim}}},
       [=](const In& in) { return mul(tanh(lookup(in[0], indices(), std::nullopt)), in[1]); }},
      {tag + " tied decoder", {table},
       [=](const In& in) { return matmul(lookup(in[0], indices(), std::nullopt), in[0].transpose(0, 1)); }},
  };
}

std::vector<DoubleBackwardCase> sparse_cases() {
  std::vector<DoubleBackwardCase> out = cases_with(flagged_lookup, "flagged");
  for (DoubleBackwardCase& c : cases_with(row_sparse_lookup, "row_sparse_backward")) out.push_back(c);
  return out;
}

}  // namespace

TEST(DoubleBackwardEmbeddingSparse, GradgradcheckInF64) { ember::testing::expect_gradgradcheck_passes(sparse_cases()); }

TEST(DoubleBackwardEmbeddingSparse, FirstOrderBitsMatchTheRowsOfAnOrdinaryBackward) {
  for (DType dtype : {DType::f32, DType::f64}) {
    for (const DoubleBackwardCase& c : sparse_cases()) {
      SCOPED_TRACE(c.name + " " + dtype_name(dtype));
      const In in = ember::testing::case_inputs(c, dtype);
      const Tensor seed = random_tensor(c.fn(in).shape(), dtype);
      const In with_graph = autograd::grad({c.fn(in)}, in, {seed}, /*create_graph=*/true);
      EXPECT_FALSE(in[0].has_sparse_grad());  // autograd::grad returns, it writes no rows
      ASSERT_TRUE(with_graph[0].defined());
      EXPECT_TRUE(with_graph[0].requires_grad());
      c.fn(in).backward(seed);
      ASSERT_TRUE(in[0].has_sparse_grad());  // the ordinary backward still leaves rows
      for (size_t i = 0; i < in.size(); ++i)
        EXPECT_TRUE(ember::testing::same_bits(with_graph[i], in[i].grad())) << i;
      // Without create_graph too: the same values, no history.
      const In plain = autograd::grad({c.fn(in)}, in, {seed});
      EXPECT_FALSE(plain[0].requires_grad());
      EXPECT_TRUE(ember::testing::same_bits(plain[0], with_graph[0]));
    }
  }
}

TEST(DoubleBackwardEmbeddingSparse, HessianVectorProductsEqualTheDenseEmbeddings) {
  const std::vector<DoubleBackwardCase> flagged = cases_with(flagged_lookup, "flagged");
  const std::vector<DoubleBackwardCase> row_sparse = cases_with(row_sparse_lookup, "row_sparse_backward");
  const std::vector<DoubleBackwardCase> dense = cases_with(dense_lookup, "dense");
  std::vector<FusedCase> pairs;
  for (size_t i = 0; i < dense.size(); ++i) {
    pairs.push_back({flagged[i], dense[i].fn});
    pairs.push_back({row_sparse[i], dense[i].fn});
  }
  ember::testing::expect_hessian_vector_products_match(pairs);
}

// loss + |d loss / d table|^2 through an ordinary backward: the penalty's gradient reaches the
// table through the lookup again, which leaves rows there.
TEST(DoubleBackwardEmbeddingSparse, AGradientPenaltyEqualsTheDenseEmbeddings) {
  const Tensor start = random_tensor({kRows, kDim}, DType::f64);
  const Tensor w = random_tensor({3, 3, kDim}, DType::f64);
  auto penalised_grad = [&](bool sparse) {
    Tensor table = start.clone().requires_grad_();
    if (sparse) table.set_row_sparse_grad();
    const Tensor e = embedding(table, indices(), 0);
    const Tensor loss = sum(mul(mul(e, e), w));
    const Tensor g = autograd::grad({loss}, {table}, {}, /*create_graph=*/true)[0];
    add(loss, sum(mul(g, g))).backward();
    if (sparse) {
      EXPECT_TRUE(table.has_sparse_grad());
    }
    return table.grad();
  };
  const std::vector<double> sparse = penalised_grad(true).to_vector<double>();
  const std::vector<double> dense = penalised_grad(false).to_vector<double>();
  ASSERT_EQ(sparse.size(), dense.size());
  for (size_t j = 0; j < dense.size(); ++j) EXPECT_NEAR(sparse[j], dense[j], 1e-9 * (1.0 + std::abs(dense[j]))) << j;
  for (int64_t col = 0; col < kDim; ++col) EXPECT_EQ(dense[size_t(col)], 0.0);  // the padding row
  EXPECT_NE(dense[size_t(2 * kDim)], 0.0);
}
