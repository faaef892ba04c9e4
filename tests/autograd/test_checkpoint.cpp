// ember::checkpoint: the forward keeps only the inputs, backward recomputes; the loss, every
// gradient (inputs and captured parameters) and the random stream equal those of the same
// computation without checkpointing, bit for bit in f32, dropout and autocast included.
#include <functional>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/node.h"
#include "autograd_graph.h"
#include "small_bert.h"
#include "test_util.h"

using namespace ember;
using ember::testing::graph_has;

namespace {

using Tensors = std::vector<Tensor>;
using Fn = std::function<Tensor(const Tensor&)>;

std::vector<float> values(const Tensor& t) {
  EXPECT_TRUE(t.defined());
  return t.defined() ? t.to(DType::f32).to_vector<float>() : std::vector<float>{};
}

// Fresh leaves from fixed values, so two runs start from the same tensors without shared grads.
struct Params {
  Tensor w1, b1, w2;
  explicit Params(uint64_t seed) {
    manual_seed(seed);
    w1 = randn({6, 8}).requires_grad_();
    b1 = randn({6}).requires_grad_();
    w2 = randn({5, 6}).requires_grad_();
  }
  Tensors all() const { return {w1, b1, w2}; }
};

// A block with dropout in train mode between two products: the recompute must replay its mask.
Tensor block(const Params& p, const Tensor& x) {
  const Tensor h = dropout(gelu(linear(x, p.w1, p.b1)), 0.3, /*training=*/true);
  return tanh(linear(h, p.w2));
}

struct BlockRun {
  std::vector<float> loss;
  std::vector<std::vector<float>> grads;  // the input's, then each parameter's
  GeneratorState rng_after;
  std::vector<float> next_draw;  // what the outer stream gives after forward and backward
};

// a -> a * 1.5 -> [block, checkpointed or not] -> dropout -> loss; the dropout after the block
// draws from the stream the checkpoint must leave as the plain forward leaves it.
BlockRun run_block(bool checkpointed, const std::function<Tensor(const Params&, const Tensor&)>& f = block) {
  Params p(21);
  manual_seed(99);
  Tensor a = randn({4, 8}).requires_grad_();
  manual_seed(7);
  const Tensor x = a * 1.5;
  const Fn fn = [&p, &f](const Tensor& in) { return f(p, in); };
  const Tensor y = checkpointed ? checkpoint(fn, x) : fn(x);
  const Tensor loss = sum(dropout(y, 0.2, true) * y);
  loss.backward();
  BlockRun r{values(loss), {values(a.grad())}, default_generator().get_state(), {}};
  for (const Tensor& t : p.all()) r.grads.push_back(values(t.grad()));
  r.next_draw = values(rand({8}));
  return r;
}

void expect_same(const BlockRun& plain, const BlockRun& ckpt) {
  EXPECT_EQ(plain.loss, ckpt.loss);
  ASSERT_EQ(plain.grads.size(), ckpt.grads.size());
  for (size_t i = 0; i < plain.grads.size(); ++i) EXPECT_EQ(plain.grads[i], ckpt.grads[i]) << "gradient " << i;
  EXPECT_EQ(plain.rng_after.seed, ckpt.rng_after.seed);
  EXPECT_EQ(plain.rng_after.offset, ckpt.rng_after.offset);
  EXPECT_EQ(plain.next_draw, ckpt.next_draw);
}


}  // namespace

TEST(Checkpoint, GradientsLossAndRandomStreamEqualThePlainRunWithDropout) {
  const BlockRun plain = run_block(false);
  const BlockRun ckpt = run_block(true);
  expect_same(plain, ckpt);
  // The dropout masks really are random: another stream gives another loss.
  manual_seed(8);
  Params p(21);
  EXPECT_NE(values(sum(block(p, randn({4, 8})))), plain.loss);
}

TEST(Checkpoint, ForwardKeepsNoGraphInsideAndOneNodeOutside) {
  Params p(3);
  const Tensor x = randn({4, 8}).requires_grad_();
  const Tensor y = checkpoint([&p](const Tensor& in) { return block(p, in); }, x);
  ASSERT_TRUE(y.requires_grad());
  ASSERT_TRUE(y.grad_fn());
  EXPECT_EQ(y.grad_fn()->name(), "CheckpointBackward");
  EXPECT_FALSE(graph_has(y, "TanhBackward"));
  ASSERT_EQ(y.grad_fn()->next_edges.size(), 1u);
  EXPECT_TRUE(y.grad_fn()->next_edges[0].valid());
}

TEST(Checkpoint, WithGradOffItOnlyCallsTheFunction) {
  Params p(4);
  const Tensor x = randn({4, 8}).requires_grad_();
  int calls = 0;
  NoGradGuard no_grad;
  const Tensor y = checkpoint([&](const Tensor& in) { ++calls; return linear(in, p.w1); }, x);
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(y.requires_grad());
}

TEST(Checkpoint, CapturedParametersGetGradientsWhenNoInputRequiresGrad) {
  auto run = [](bool checkpointed) {
    Params p(5);
    manual_seed(6);
    const Tensor x = randn({3, 8});
    const Fn fn = [&p](const Tensor& in) { return block(p, in); };
    manual_seed(12);
    const Tensor loss = sum(checkpointed ? checkpoint(fn, x) : fn(x));
    loss.backward();
    std::vector<std::vector<float>> grads;
    for (const Tensor& t : p.all()) grads.push_back(values(t.grad()));
    return grads;
  };
  EXPECT_EQ(run(false), run(true));
}

TEST(Checkpoint, VectorFormWithAnInputThatNeedsNoGradAndAnUnusedOutput) {
  auto run = [](bool checkpointed) {
    manual_seed(31);
    Tensor a = randn({4, 6}).requires_grad_();
    const Tensor b = randn({4, 6});  // no grad
    Tensor w = randn({6, 6}).requires_grad_();
    const std::function<Tensors(const Tensors&)> fn = [&w](const Tensors& in) {
      const Tensor h = dropout(matmul(in[0] * in[1], w), 0.25, true);
      return Tensors{h + in[1], sum(h * h), in[0] * 3.0};  // the third goes unused
    };
    manual_seed(32);
    const Tensors out = checkpointed ? checkpoint(fn, Tensors{a, b}) : fn({a, b});
    EXPECT_EQ(out.size(), 3u);
    const Tensor loss = sum(tanh(out[0])) + out[1];
    loss.backward();
    EXPECT_FALSE(b.grad().defined());
    return std::vector<std::vector<float>>{values(loss), values(a.grad()), values(w.grad())};
  };
  EXPECT_EQ(run(false), run(true));
}

TEST(Checkpoint, NestedCheckpointsEqualThePlainRun) {
  // Outer block: inner checkpointed block, then a dropout and a product of its own.
  const auto nested = [](bool checkpointed) {
    return [checkpointed](const Params& p, const Tensor& x) {
      const Fn inner = [&p](const Tensor& in) { return block(p, in); };
      const Tensor h = checkpointed ? checkpoint(inner, x) : inner(x);
      return dropout(h, 0.4, true) * 2.0 + h;
    };
  };
  const BlockRun plain = run_block(false, nested(false));
  const BlockRun ckpt = run_block(true, nested(true));
  expect_same(plain, ckpt);
}

TEST(Checkpoint, UnderAutocastBf16GradientsEqualThePlainAutocastRun) {
  auto run = [](bool checkpointed) {
    Params p(41);
    manual_seed(42);
    Tensor a = randn({4, 8}).requires_grad_();
    Tensor loss;
    {
      AutocastGuard autocast(DeviceType::CPU, DType::bf16);
      manual_seed(43);
      const Fn fn = [&p](const Tensor& in) { return block(p, in); };
      const Tensor y = checkpointed ? checkpoint(fn, a) : fn(a);
      EXPECT_EQ(y.dtype(), DType::bf16);
      loss = sum(y.to(DType::f32));
    }
    loss.backward();
    std::vector<std::vector<float>> r{values(loss), values(a.grad())};
    for (const Tensor& t : p.all()) {
      EXPECT_EQ(t.grad().dtype(), DType::f32);
      r.push_back(values(t.grad()));
    }
    return r;
  };
  EXPECT_EQ(run(false), run(true));
}

TEST(Checkpoint, AnInputModifiedInPlaceBeforeBackwardIsTheVersionCounterError) {
  Params p(51);
  Tensor a = randn({4, 8}).requires_grad_();
  Tensor x = a * 1.0;
  const Tensor y = checkpoint([&p](const Tensor& in) { return block(p, in); }, x);
  const uint64_t saved = x.version();
  {
    NoGradGuard no_grad;  // Ember refuses in-place writes into tensors that require grad otherwise
    x.mul_(2.0);
  }
  EXPECT_EMBER_ERROR(sum(y).backward(), "modified by an inplace operation",
                     "CheckpointBackward saved a tensor of shape [4, 8] at version " + std::to_string(saved));
  EXPECT_FALSE(p.w1.grad().defined());
}

TEST(Checkpoint, ACapturedNonLeafThatRequiresGradIsRefused) {
  Params p(61);
  const Tensor x = randn({4, 8}).requires_grad_();
  const Tensor scale = p.b1 * 2.0;  // history outside the checkpoint
  const Tensor y = checkpoint([&](const Tensor& in) { return linear(in, p.w1) * scale; }, x);
  EXPECT_EMBER_ERROR(sum(y).backward(), "checkpoint:", "MulBackward", "pass it in the inputs");
  // Refused before any gradient reached a parameter.
  EXPECT_FALSE(p.w1.grad().defined());
  EXPECT_FALSE(p.b1.grad().defined());
  // Passed as an input it works, and its gradient reaches b1 through the outer graph.
  const Tensors out = checkpoint([&](const Tensors& in) { return Tensors{linear(in[0], p.w1) * in[1]}; },
                                 Tensors{x, scale});
  sum(out[0]).backward();
  EXPECT_TRUE(p.b1.grad().defined());
  EXPECT_TRUE(p.w1.grad().defined());
}

TEST(Checkpoint, CallbacksQueuedDuringTheRecomputeRunAtTheEndOfTheOuterBackward) {
  Params p(71);
  Tensor a = randn({4, 8}).requires_grad_();
  const Tensor x = a * 1.0;  // a's accumulator runs after the checkpoint's backward
  bool a_grad_seen_by_callback = false;
  int callbacks = 0;
  auto handle = p.w1.register_post_accumulate_grad_hook([&](const Tensor&) {
    autograd::queue_callback([&] {
      ++callbacks;
      a_grad_seen_by_callback = a.grad().defined();
    });
  });
  const Tensor y = checkpoint([&p](const Tensor& in) { return block(p, in); }, x);
  sum(y).backward();
  EXPECT_EQ(callbacks, 1);
  EXPECT_TRUE(a_grad_seen_by_callback);
}

TEST(Checkpoint, BertWithGradientCheckpointingGivesTheSameLossAndGradients) {
  nn::BertConfig cfg = ember::testing::one_layer_bert_config(40);
  cfg.num_hidden_layers = 2;
  cfg.hidden_dropout_prob = 0.2;
  cfg.attention_probs_dropout_prob = 0.2;
  const Tensor ids = from_vector(std::vector<int64_t>{1, 7, 3, 9, 0, 4, 2, 8, 5, 6, 11, 12}, {2, 6});
  const Tensor mask = from_vector(std::vector<int64_t>{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, {2, 6});
  const Tensor labels = from_vector(std::vector<int64_t>{-100, 7, -100, 9, 0, -100, 2, -100, 5, 6, -100, -100}, {2, 6});

  auto run = [&](bool checkpointed) {
    manual_seed(81);
    nn::BertForMaskedLM model(cfg);
    model.train();
    if (checkpointed) model.gradient_checkpointing_enable();
    EXPECT_EQ(model.is_gradient_checkpointing(), checkpointed);
    manual_seed(82);
    const Tensor loss = model.forward(ids, mask, Tensor(), labels).loss;
    EXPECT_EQ(graph_has(loss, "CheckpointBackward"), checkpointed);
    loss.backward();
    std::vector<std::vector<float>> r{values(loss)};
    for (const auto& [name, t] : model.named_parameters()) r.push_back(values(t.grad()));
    const GeneratorState after = default_generator().get_state();
    r.push_back({float(after.offset)});
    return r;
  };
  const auto plain = run(false);
  const auto ckpt = run(true);
  ASSERT_EQ(plain.size(), ckpt.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(plain[i], ckpt[i]) << "entry " << i;
}

TEST(Checkpoint, BertCheckpointsOnlyWhileTrainingWithGrad) {
  manual_seed(91);
  nn::BertModel model(ember::testing::one_layer_bert_config(30));
  model.gradient_checkpointing_enable();
  const Tensor ids = from_vector(std::vector<int64_t>{1, 2, 3, 4}, {1, 4});
  EXPECT_TRUE(graph_has(model.forward(ids).last_hidden_state, "CheckpointBackward"));
  model.eval();
  EXPECT_FALSE(graph_has(model.forward(ids).last_hidden_state, "CheckpointBackward"));
  model.train();
  {
    NoGradGuard no_grad;
    EXPECT_FALSE(model.forward(ids).last_hidden_state.requires_grad());
  }
  model.gradient_checkpointing_disable();
  EXPECT_FALSE(model.is_gradient_checkpointing());
  EXPECT_FALSE(graph_has(model.forward(ids).last_hidden_state, "CheckpointBackward"));
}
