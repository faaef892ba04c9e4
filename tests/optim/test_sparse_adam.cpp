// AdamW on row-sparse gradients (core/sparse_grad.h): by default the rows are added into a
// dense gradient and the step is exactly the dense one; with lazy_sparse only the touched rows
// (and their moments) move, as torch.optim.SparseAdam.
#include <memory>
#include <optional>
#include <vector>

#include "core/sparse_grad.h"
#include "nn/layers/basic.h"
#include "optim/sgd_adam.h"
#include "test_util.h"

using namespace ember;

namespace {

struct TrainedTable {
  std::vector<float> weight;
  std::vector<float> exp_avg;
};

// Five AdamW steps of sum(lookup * w) on an 12 x 4 table; the steps touch rows from `ids`.
TrainedTable train(bool sparse, bool lazy, const std::vector<std::vector<int64_t>>& ids) {
  auto e = std::make_shared<nn::Embedding>(12, 4, std::nullopt, sparse);
  {
    NoGradGuard ng;
    std::vector<float> init(48);
    for (size_t i = 0; i < init.size(); ++i) init[i] = 0.05f * float(i % 7) - 0.1f;
    e->weight.copy_(from_vector<float>(init, {12, 4}));
  }
  optim::AdamW opt(e->parameters(), {.lr = 0.05, .weight_decay = 0.1, .lazy_sparse = lazy});
  for (size_t s = 0; s < 5; ++s) {
    const std::vector<int64_t>& step_ids = ids[s % ids.size()];
    Tensor idx = from_vector<int64_t>(step_ids, {int64_t(step_ids.size())});
    Tensor w = full({int64_t(step_ids.size()), 4}, 0.3 + 0.1 * double(s));
    (e->forward(idx) * w).sum().backward();
    opt.step();
    opt.zero_grad();
  }
  return {e->weight.to_vector<float>(), opt.state(e->weight).buffers["exp_avg"].to_vector<float>()};
}

}  // namespace

TEST(SparseAdam, RowsAddedIntoADenseGradientStepExactlyAsDense) {
  const std::vector<std::vector<int64_t>> ids{{1, 3, 3, 7}, {2, 7}, {11, 1, 0}};
  const TrainedTable dense = train(false, false, ids);
  const TrainedTable rows = train(true, false, ids);
  EXPECT_EQ(rows.weight, dense.weight);
  EXPECT_EQ(rows.exp_avg, dense.exp_avg);
}

TEST(SparseAdam, LazyStepsMoveOnlyTouchedRows) {
  // Rows 1, 3 and 7 every step: the lazy and the dense rule agree on them (their gradients are
  // the same every step; only the kernels' vector width differs); every other row stays where it
  // started, while the dense rule decays it.
  const std::vector<std::vector<int64_t>> ids{{1, 3, 3, 7}};
  const TrainedTable dense = train(false, false, ids);
  const TrainedTable lazy = train(true, true, ids);
  const TrainedTable start = train(true, true, {{}});  // no row touched: nothing moves
  for (int64_t r = 0; r < 12; ++r) {
    const bool touched = r == 1 || r == 3 || r == 7;
    for (int64_t c = 0; c < 4; ++c) {
      const size_t i = size_t(r * 4 + c);
      if (touched) {
        EXPECT_NEAR(lazy.weight[i], dense.weight[i], 1e-7) << "row " << r;
        EXPECT_NE(lazy.weight[i], start.weight[i]) << "row " << r;
      } else {
        EXPECT_EQ(lazy.weight[i], start.weight[i]) << "row " << r;
        EXPECT_EQ(lazy.exp_avg[i], 0.0f) << "row " << r;
      }
    }
  }
  EXPECT_NE(dense.weight, lazy.weight);  // weight decay moved the untouched rows under the dense rule
}

TEST(SparseAdam, ATableWithADensePartStepsDensely) {
  // lazy_sparse applies only when the whole gradient is rows; a tied use makes it dense.
  auto e = std::make_shared<nn::Embedding>(6, 2, std::nullopt, true);
  optim::AdamW opt(e->parameters(), {.lr = 0.1, .weight_decay = 0.0, .lazy_sparse = true});
  const std::vector<float> before = e->weight.to_vector<float>();
  Tensor idx = from_vector<int64_t>({2}, {1});
  matmul(e->forward(idx), e->weight.transpose(0, 1)).sum().backward();
  opt.step();
  const std::vector<float> after = e->weight.to_vector<float>();
  for (size_t i = 0; i < after.size(); ++i) EXPECT_NE(after[i], before[i]) << i;  // every row had a gradient
}
