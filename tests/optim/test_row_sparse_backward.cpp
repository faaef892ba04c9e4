// nn::Embedding::row_sparse_backward (BERT's and GPT-2's word embeddings): the lookup leaves the
// weight its rows, and the optimizers, clip_grad_norm_ and GradScaler read them directly. Every
// result must equal the dense path's bit for bit: each run below is made twice, with the flag
// off and on, from the same seed, and the parameters, optimizer state and norms compared exactly.
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "core/factory.h"
#include "core/native/fused_optim.h"
#include "core/ops.h"
#include "core/rng.h"
#include "core/sparse_grad.h"
#include "nn/layers/basic.h"
#include "nn/models/bert.h"
#include "nn/models/gpt2.h"
#include "optim/clip_grad.h"
#include "optim/grad_scaler.h"
#include "optim/sgd_adam.h"
#include "small_bert.h"
#include "test_util.h"

using namespace ember;

namespace {

// 700 x 37: 25,900 elements, so sum() cuts the norm into two chunks, the second ending in a
// partial group of lanes, and each row ends in scalar tail elements of the Adam kernel.
constexpr int64_t kRows = 700, kWidth = 37, kPadding = 3;

enum class Kind { Adam, AdamW, SGD };

struct Setup {
  Kind kind = Kind::AdamW;
  double weight_decay = 0.0;
  double momentum = 0.0;
  bool nesterov = false;
  int micro_batches = 1;
  bool tied = false;          // a dense use of the weight as well (an MLM decoder)
  double clip_norm_type = 0;  // 0: no clipping
  bool scaler = false;        // GradScaler around backward and step
  int inf_step = -1;          // a step whose gradient holds an inf
};

struct Result {
  std::vector<float> weight;
  std::vector<std::vector<float>> state;
  std::vector<double> norms;
  bool used_rows = false;  // the first micro-batch left rows (alone, or beside a dense part)
};

std::unique_ptr<optim::Optimizer> make_optimizer(const Setup& s, const std::vector<Tensor>& params) {
  switch (s.kind) {
    case Kind::Adam:
      return std::make_unique<optim::Adam>(params, optim::AdamOptions{.lr = 0.01, .weight_decay = s.weight_decay});
    case Kind::AdamW:
      return std::make_unique<optim::AdamW>(params, optim::AdamWOptions{.lr = 0.01, .weight_decay = s.weight_decay});
    case Kind::SGD:
      return std::make_unique<optim::SGD>(
          params, optim::SGDOptions{.lr = 0.05, .momentum = s.momentum, .weight_decay = s.weight_decay,
                                    .nesterov = s.nesterov});
  }
  return nullptr;
}

Result train(const Setup& s, bool rows) {
  manual_seed(1234);
  auto e = std::make_shared<nn::Embedding>(kRows, kWidth, kPadding);
  e->row_sparse_backward = rows;
  const Tensor decoder_input = randn({6, kWidth});
  auto opt = make_optimizer(s, e->parameters());
  optim::GradScaler scaler(optim::GradScalerOptions{.init_scale = 1024.0});
  Result out;
  for (int step = 0; step < 3; ++step) {
    for (int micro = 0; micro < s.micro_batches; ++micro) {
      // 64 ids over 0..199 with repeats, and the padding row among them.
      Tensor ids = randint(0, 200, {4, 16});
      {
        NoGradGuard ng;
        ids.select(0, 0).select(0, 5).fill_(kPadding);
      }
      Tensor w = randn({4, 16, kWidth});
      if (step == s.inf_step && micro == 0) {
        NoGradGuard ng;
        w.select(0, 1).select(0, 2).select(0, 3).fill_(std::numeric_limits<double>::infinity());
      }
      Tensor loss = (e->forward(ids) * w).sum();
      if (s.tied) loss = loss + matmul(decoder_input, e->weight.t()).pow(2.0).mean();
      (s.scaler ? scaler.scale(loss) : loss).backward();
      // Tied: later micro-batches go dense (the rows would join the sum in another order).
      if (micro == 0) out.used_rows = out.used_rows || e->weight.has_sparse_grad();
    }
    if (s.clip_norm_type != 0) {
      if (s.scaler) scaler.unscale_(*opt);
      out.norms.push_back(optim::clip_grad_norm_(e->parameters(), 0.5, s.clip_norm_type));
    }
    if (s.scaler) {
      scaler.step(*opt);
      scaler.update();
    } else {
      opt->step();
    }
    opt->zero_grad();
  }
  out.weight = e->weight.to_vector<float>();
  for (const auto& [name, t] : opt->state(e->weight).buffers) out.state.push_back(t.to_vector<float>());
  return out;
}

void expect_rows_equal_dense(const Setup& s) {
  const Result dense = train(s, false);
  const Result rows = train(s, true);
  EXPECT_FALSE(dense.used_rows);
  EXPECT_TRUE(rows.used_rows);
  ASSERT_EQ(rows.weight.size(), dense.weight.size());
  for (size_t i = 0; i < dense.weight.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(rows.weight[i]), std::bit_cast<uint32_t>(dense.weight[i])) << "element " << i;
  ASSERT_EQ(rows.state.size(), dense.state.size());
  for (size_t b = 0; b < dense.state.size(); ++b) EXPECT_EQ(rows.state[b], dense.state[b]) << "state buffer " << b;
  ASSERT_EQ(rows.norms.size(), dense.norms.size());
  for (size_t k = 0; k < dense.norms.size(); ++k) EXPECT_EQ(rows.norms[k], dense.norms[k]) << "norm of step " << k;
}

}  // namespace

TEST(RowSparseBackward, AdamWStepsEqualTheDenseSteps) {
  expect_rows_equal_dense({.kind = Kind::AdamW, .weight_decay = 0.01});
  expect_rows_equal_dense({.kind = Kind::AdamW, .weight_decay = 0.0});
}

TEST(RowSparseBackward, AdamStepsEqualTheDenseSteps) {
  expect_rows_equal_dense({.kind = Kind::Adam});
  expect_rows_equal_dense({.kind = Kind::Adam, .weight_decay = 0.1});  // L2: every row's gradient moves
}

TEST(RowSparseBackward, SgdStepsEqualTheDenseSteps) {
  expect_rows_equal_dense({.kind = Kind::SGD});
  expect_rows_equal_dense({.kind = Kind::SGD, .weight_decay = 0.01, .momentum = 0.9});
  expect_rows_equal_dense({.kind = Kind::SGD, .momentum = 0.9, .nesterov = true});
}

TEST(RowSparseBackward, ThreeMicroBatchesAccumulateAsDense) {
  expect_rows_equal_dense({.kind = Kind::AdamW, .weight_decay = 0.01, .micro_batches = 3});
  expect_rows_equal_dense({.kind = Kind::SGD, .momentum = 0.9, .micro_batches = 3});
}

TEST(RowSparseBackward, ClipGradNormReadsTheRows) {
  expect_rows_equal_dense({.kind = Kind::AdamW, .weight_decay = 0.01, .clip_norm_type = 2.0});
  expect_rows_equal_dense({.kind = Kind::AdamW, .micro_batches = 3, .clip_norm_type = 2.0});
  expect_rows_equal_dense(
      {.kind = Kind::SGD, .momentum = 0.9, .clip_norm_type = std::numeric_limits<double>::infinity()});
}

TEST(RowSparseBackward, TiedDecoderAddsTheRowsIntoItsDenseGradient) {
  expect_rows_equal_dense({.kind = Kind::AdamW, .weight_decay = 0.01, .tied = true});
  expect_rows_equal_dense({.kind = Kind::AdamW, .micro_batches = 3, .tied = true, .clip_norm_type = 2.0});
}

TEST(RowSparseBackward, GradScalerUnscalesAndFindsInfInTheRows) {
  expect_rows_equal_dense({.kind = Kind::AdamW, .weight_decay = 0.01, .scaler = true});
  expect_rows_equal_dense({.kind = Kind::AdamW, .weight_decay = 0.01, .clip_norm_type = 2.0, .scaler = true,
                           .inf_step = 1});
}

TEST(RowSparseBackward, GradReadsDenseAndSkipsPaddingRows) {
  manual_seed(7);
  auto e = std::make_shared<nn::Embedding>(10, 3, 2);
  e->row_sparse_backward = true;
  EXPECT_FALSE(e->sparse());  // not torch's sparse=True
  const Tensor ids = from_vector<int64_t>({4, 2, 4, 9, 2}, {5});
  const Tensor w = randn({5, 3});
  (e->forward(ids) * w).sum().backward();
  ASSERT_TRUE(e->weight.has_sparse_grad());
  const RowSparseGrad g = e->weight.sparse_grad();
  EXPECT_EQ(g.indices.to_vector<int64_t>(), (std::vector<int64_t>{4, 9}));  // padding row 2 left out
  const std::vector<float> grad = e->weight.grad().to_vector<float>();     // dense on read
  const std::vector<float> wv = w.to_vector<float>();
  for (int64_t r = 0; r < 10; ++r)
    for (int64_t c = 0; c < 3; ++c) {
      float want = 0.0f;
      if (r == 4) want = 0.0f + wv[size_t(0 * 3 + c)] + wv[size_t(2 * 3 + c)];
      if (r == 9) want = 0.0f + wv[size_t(3 * 3 + c)];
      EXPECT_EQ(grad[size_t(r * 3 + c)], want) << "row " << r << " column " << c;
    }
}

TEST(RowSparseBackward, AWeightWithHooksGetsTheDenseGradient) {
  auto e = std::make_shared<nn::Embedding>(10, 3);
  e->row_sparse_backward = true;
  int calls = 0;
  e->weight.register_post_accumulate_grad_hook([&](const Tensor&) { ++calls; });
  e->forward(from_vector<int64_t>({1, 5}, {2})).sum().backward();
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(e->weight.has_sparse_grad());
  EXPECT_TRUE(e->weight.dense_grad_part().defined());
}

TEST(RowSparseBackward, RowKernelsRefuseBadRows) {
  const Tensor p = zeros({4, 2}), m = zeros({4, 2}), v = zeros({4, 2});
  const native::AdamStepArgs args{0.1, 0.9, 0.999, 1e-8, 0.0, true, 0.1, 0.001};
  EXPECT_EMBER_ERROR(native::adam_rows_step(p, from_vector<int64_t>({2, 1}, {2}), zeros({2, 2}), m, v, args),
                     "adam_rows_step: row_index[1] = 1 is not ascending within [0, 4)");
  EXPECT_EMBER_ERROR(native::adam_rows_step(p, from_vector<int64_t>({1}, {1}), zeros({1, 3}), m, v, args),
                     "adam_rows_step: row_values of shape [1, 3] do not fit 1 rows of 2");
}

namespace {
// Two AdamW steps with clipping of `model` on random batches of ids below 300 (`loss_of` gives
// the loss of one); checks that `table` got rows exactly when `rows`. Returns every parameter.
std::vector<std::vector<float>> train_two_steps(nn::Module& model, const Tensor& table, bool rows,
                                                const std::function<Tensor(const Tensor&)>& loss_of) {
  optim::AdamW opt(model.parameters(), {.lr = 1e-3, .weight_decay = 0.1});
  for (int step = 0; step < 2; ++step) {
    loss_of(randint(0, 300, {2, 12})).backward();
    EXPECT_EQ(table.has_sparse_grad(), rows);
    optim::clip_grad_norm_(model.parameters(), 1.0);
    opt.step();
    opt.zero_grad();
  }
  std::vector<std::vector<float>> params;
  for (const Tensor& p : model.parameters()) params.push_back(p.to_vector<float>());
  return params;
}

// the shared one-layer BERT, without dropout so both runs see the same forward
nn::BertConfig small_bert() {
  nn::BertConfig c = ember::testing::one_layer_bert_config(300);
  c.hidden_dropout_prob = 0.0;
  c.attention_probs_dropout_prob = 0.0;
  return c;
}
}  // namespace

TEST(RowSparseBackward, BertWordEmbeddingsTrainAsDense) {
  const auto mlm = [](bool rows) {
    manual_seed(99);
    nn::BertForMaskedLM model(small_bert());
    nn::Embedding& table = *model.bert->embeddings->word_embeddings;
    EXPECT_TRUE(table.row_sparse_backward);
    EXPECT_FALSE(table.sparse());
    table.row_sparse_backward = rows;
    return train_two_steps(model, table.weight, rows, [&](const Tensor& ids) {
      return model.forward(ids, Tensor(), Tensor(), randint(0, 300, {2, 12})).loss;
    });
  };
  EXPECT_EQ(mlm(true), mlm(false));  // tied decoder
  const auto cls = [](bool rows) {
    manual_seed(98);
    nn::BertForSequenceClassification model(small_bert());
    model.bert->embeddings->word_embeddings->row_sparse_backward = rows;
    return train_two_steps(model, model.bert->embeddings->word_embeddings->weight, rows, [&](const Tensor& ids) {
      return model.forward(ids, Tensor(), Tensor(), randint(0, 2, {2})).loss;
    });
  };
  EXPECT_EQ(cls(true), cls(false));  // rows alone
}

TEST(RowSparseBackward, Gpt2TokenEmbeddingsTrainAsDense) {
  const auto run = [](bool rows) {
    manual_seed(5);
    nn::GPT2Config c;
    c.vocab_size = 300;
    c.n_positions = 16;
    c.n_embd = 32;
    c.n_layer = 1;
    c.n_head = 2;
    c.resid_pdrop = c.embd_pdrop = c.attn_pdrop = 0.0;
    nn::GPT2LMHeadModel model(c);
    EXPECT_TRUE(model.transformer->wte->row_sparse_backward);
    model.transformer->wte->row_sparse_backward = rows;
    return train_two_steps(model, model.transformer->wte->weight, rows,
                           [&](const Tensor& ids) { return model.forward(ids, Tensor(), ids).loss; });
  };
  EXPECT_EQ(run(true), run(false));
}
