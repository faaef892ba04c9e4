// Row-sparse gradients (core/sparse_grad.h): an Embedding(sparse) lookup leaves the rows it
// read, and reading the whole gradient adds them into the dense tensor. Compared with the dense
// embedding backward, which is the reference here.
#include <algorithm>
#include <memory>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "core/native/nn_functional.h"
#include "core/sparse_grad.h"
#include "nn/layers/basic.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;

namespace {

Tensor random_indices(uint64_t seed, int64_t n, int64_t rows, Shape shape) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int64_t> pick(0, rows - 1);
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = pick(gen);
  return from_vector<int64_t>(v, std::move(shape));
}

Tensor random_values(uint64_t seed, Shape shape) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> d;
  std::vector<float> v(size_t(numel_of(shape)));
  for (auto& x : v) x = float(d(gen));
  return from_vector<float>(v, std::move(shape));
}

// Two embeddings with equal weights, one sparse.
std::pair<std::shared_ptr<nn::Embedding>, std::shared_ptr<nn::Embedding>> twins(int64_t rows, int64_t dim,
                                                                                 std::optional<int64_t> pad = {}) {
  auto dense = std::make_shared<nn::Embedding>(rows, dim, pad);
  auto sparse = std::make_shared<nn::Embedding>(rows, dim, pad, /*sparse=*/true);
  NoGradGuard ng;
  sparse->weight.copy_(dense->weight);
  return {dense, sparse};
}

}  // namespace

TEST(RowSparseGrad, CoalescedRowsEqualTheDenseEmbeddingBackward) {
  const Tensor idx = random_indices(1, 60, 17, {6, 10});  // many repeats
  const Tensor grad = random_values(2, {6, 10, 5});
  for (int64_t pad : {int64_t(-1), int64_t(3)}) {
    const RowSparseGrad rows = coalesce_rows(idx, grad, 17, pad);
    const std::vector<int64_t> got = rows.indices.to_vector<int64_t>();
    EXPECT_TRUE(std::is_sorted(got.begin(), got.end()));
    EXPECT_EQ(std::adjacent_find(got.begin(), got.end()), got.end());
    EXPECT_EQ(std::count(got.begin(), got.end(), 3), pad == 3 ? 0 : 1);
    EXPECT_EQ(rows.values.shape(), (Shape{rows.nnz_rows(), 5}));
    // Bit for bit: each row adds its contributions in the same order.
    EXPECT_EQ(to_dense(rows).to_vector<float>(), native::embedding_backward(grad, idx, 17, pad).to_vector<float>());
  }
}

TEST(RowSparseGrad, MergingPartsSumsSharedRows) {
  const RowSparseGrad a = coalesce_rows(from_vector<int64_t>({4, 1}, {2}), random_values(3, {2, 3}), 6);
  const RowSparseGrad b = coalesce_rows(from_vector<int64_t>({1, 5, 1}, {3}), random_values(4, {3, 3}), 6);
  const RowSparseGrad m = merge_row_sparse({a, RowSparseGrad{}, b});
  EXPECT_EQ(m.indices.to_vector<int64_t>(), (std::vector<int64_t>{1, 4, 5}));
  Tensor want = to_dense(a);
  want.add_(to_dense(b));
  EXPECT_TRUE(all_close(to_dense(m), want, 1e-6, 1e-6));
  EXPECT_EMBER_ERROR(merge_row_sparse({a, coalesce_rows(from_vector<int64_t>({0}, {1}), random_values(5, {1, 3}), 7)}),
                     "cannot be merged");
  EXPECT_EMBER_ERROR(coalesce_rows(from_vector<int64_t>({9}, {1}), random_values(5, {1, 3}), 6), "out of range");
}

TEST(RowSparseGrad, SparseLookupLeavesRowsAndTheWholeGradientMatchesDense) {
  auto [dense, sparse] = twins(40, 6, /*pad=*/0);
  const Tensor idx = random_indices(7, 24, 40, {4, 6});
  const Tensor w = random_values(8, {4, 6, 6});
  (dense->forward(idx) * w).sum().backward();
  (sparse->forward(idx) * w).sum().backward();
  ASSERT_TRUE(sparse->weight.has_sparse_grad());
  EXPECT_FALSE(sparse->weight.dense_grad_part().defined());  // no table was built
  const std::vector<int64_t> touched = sparse->weight.sparse_grad().indices.to_vector<int64_t>();
  EXPECT_LE(touched.size(), 24u);
  EXPECT_EQ(std::count(touched.begin(), touched.end(), 0), 0);  // the padding row takes no gradient
  EXPECT_EQ(sparse->weight.grad().to_vector<float>(), dense->weight.grad().to_vector<float>());
  EXPECT_FALSE(sparse->weight.has_sparse_grad());  // grad() added the rows in
}

TEST(RowSparseGrad, ADenseUseOfTheSameTableAddsToTheRows) {
  // A tied decoder: logits = lookup @ table^T, as BERT's MLM head.
  auto [dense, sparse] = twins(30, 4);
  const Tensor idx = random_indices(9, 12, 30, {12});
  const Tensor target = random_indices(10, 12, 30, {12});
  for (auto* e : {dense.get(), sparse.get()})
    cross_entropy(matmul(e->forward(idx), e->weight.transpose(0, 1)), target).backward();
  ASSERT_TRUE(sparse->weight.has_sparse_grad());
  EXPECT_TRUE(sparse->weight.dense_grad_part().defined());  // the decoder's part
  EXPECT_TRUE(all_close(sparse->weight.grad(), dense->weight.grad(), 1e-7, 1e-7));
}

TEST(RowSparseGrad, PassesAccumulateAndZeroGradDropsTheRows) {
  auto [dense, sparse] = twins(20, 3);
  int sparse_hooks = 0, dense_hooks = 0;
  auto h1 = sparse->weight.register_post_accumulate_sparse_grad_hook([&](const Tensor&) { ++sparse_hooks; });
  auto h2 = sparse->weight.register_post_accumulate_grad_hook([&](const Tensor&) { ++dense_hooks; });
  for (uint64_t s = 0; s < 3; ++s) {
    const Tensor idx = random_indices(20 + s, 8, 20, {8});
    const Tensor w = random_values(30 + s, {8, 3});
    (dense->forward(idx) * w).sum().backward();
    (sparse->forward(idx) * w).sum().backward();
  }
  EXPECT_EQ(sparse_hooks, 3);
  EXPECT_EQ(dense_hooks, 0);
  EXPECT_TRUE(all_close(sparse->weight.grad(), dense->weight.grad(), 1e-6, 1e-6));
  (sparse->forward(random_indices(40, 8, 20, {8})).sum()).backward();
  sparse->zero_grad();
  EXPECT_FALSE(sparse->weight.has_sparse_grad());
  EXPECT_FALSE(sparse->weight.grad().defined());
  // set_grad replaces the whole gradient, rows included.
  (sparse->forward(random_indices(41, 8, 20, {8})).sum()).backward();
  sparse->weight.set_grad(zeros({20, 3}));
  EXPECT_FALSE(sparse->weight.has_sparse_grad());
  EXPECT_EQ(sparse->weight.grad().to_vector<float>(), std::vector<float>(60, 0.0f));
}

TEST(RowSparseGrad, OnlyTwoDimensionalLeavesTakeRowSparseGradients) {
  Tensor v = zeros({5}).requires_grad_();
  EXPECT_EMBER_ERROR(v.set_row_sparse_grad(), "2-D leaf");
  Tensor t = zeros({5, 2}).requires_grad_();
  EXPECT_EMBER_ERROR(t.set_sparse_grad(coalesce_rows(from_vector<int64_t>({1}, {1}), zeros({1, 3}), 5)),
                     "set_sparse_grad");
}
