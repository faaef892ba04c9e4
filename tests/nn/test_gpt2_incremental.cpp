// GPT-2 beyond one forward pass: the key/value cache (transformers' past_key_values) and
// gradient checkpointing. Feeding a sequence piece by piece through a GPT2KVCache gives the
// logits of one full forward at every position (with and without a padding mask), generate()
// samples the same tokens with and without the cache (also once the context slides past
// n_positions), bad cache use names the shapes, and checkpointed blocks give the loss and
// gradients of plain training bit for bit, dropout included.
#include <string>
#include <vector>

#include "autograd_graph.h"
#include "core/grad_mode.h"
#include "nn/models/gpt2.h"
#include "test_util.h"

using namespace ember;
using namespace ember::nn;
using ember::testing::all_close;
using ember::testing::graph_has;

namespace {

GPT2Config small_config(double dropout = 0.0) {
  GPT2Config c;
  c.vocab_size = 50;
  c.n_positions = 16;
  c.n_embd = 32;
  c.n_layer = 2;
  c.n_head = 4;
  c.resid_pdrop = c.embd_pdrop = c.attn_pdrop = dropout;
  c.initializer_range = 0.2;  // logits far enough apart that rounding never flips an argmax
  return c;
}

Tensor token_ids(int64_t batch, int64_t len, uint64_t seed) {
  manual_seed(seed);
  return randint(0, 50, {batch, len});
}

}  // namespace

TEST(GPT2KVCache, PieceByPieceEqualsOneFullForward) {
  manual_seed(3);
  GPT2LMHeadModel model(small_config());
  model.eval();
  NoGradGuard ng;
  const Tensor ids = token_ids(2, 12, 4);
  const Tensor full = model.forward(ids).logits;
  // A prompt of 5, one token, a chunk of 4 (causal within the chunk), then two single tokens.
  GPT2KVCache cache;
  int64_t at = 0;
  for (int64_t piece : {5, 1, 4, 1, 1}) {
    const Tensor logits = model.forward(ids.narrow(1, at, piece).contiguous(), Tensor(), Tensor(), &cache).logits;
    EXPECT_EQ(cache.length(), at + piece);
    EXPECT_TRUE(all_close(logits, full.narrow(1, at, piece), 1e-5, 1e-5)) << "tokens " << at << ".." << at + piece;
    at += piece;
  }
  EXPECT_EQ(cache.layers.size(), 2u);
  EXPECT_EQ(cache.layers[1].keys.shape(), (Shape{2, 4, 12, 8}));
}

TEST(GPT2KVCache, APaddingMaskCoversTheCachedTokensToo) {
  manual_seed(5);
  GPT2LMHeadModel model(small_config());
  model.eval();
  NoGradGuard ng;
  const Tensor ids = token_ids(2, 8, 6);
  // Row 1 is left-padded by 3: its first three keys are hidden from every query.
  const Tensor mask = from_vector(std::vector<int64_t>{1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1}, {2, 8});
  const Tensor full = model.forward(ids, mask).logits;
  GPT2KVCache cache;
  model.forward(ids.narrow(1, 0, 6).contiguous(), mask.narrow(1, 0, 6).contiguous(), Tensor(), &cache);
  const Tensor rest = model.forward(ids.narrow(1, 6, 2).contiguous(), mask, Tensor(), &cache).logits;
  EXPECT_TRUE(all_close(rest, full.narrow(1, 6, 2), 1e-5, 1e-5));
}

TEST(GPT2KVCache, GenerateSamplesTheSameTokensWithAndWithoutIt) {
  manual_seed(7);
  GPT2LMHeadModel model(small_config());
  const Tensor prompt = token_ids(3, 4, 8);
  for (int64_t new_tokens : {6, 20}) {  // 4 + 20 > n_positions = 16: the window slides
    for (double temperature : {0.0, 0.9}) {
      auto sample = [&](bool use_cache) {
        Generator gen(11);
        return model
            .generate(prompt, {.max_new_tokens = new_tokens, .temperature = temperature, .top_k = 10,
                               .generator = &gen, .use_cache = use_cache})
            .to_vector<int64_t>();
      };
      EXPECT_EQ(sample(true), sample(false)) << new_tokens << " tokens at temperature " << temperature;
    }
  }
}

TEST(GPT2KVCache, BadUseNamesTheShapes) {
  manual_seed(9);
  GPT2LMHeadModel model(small_config());
  NoGradGuard ng;
  GPT2KVCache cache;
  model.forward(token_ids(2, 10, 1), Tensor(), Tensor(), &cache);
  EXPECT_EMBER_ERROR(model.forward(token_ids(2, 7, 2), Tensor(), Tensor(), &cache), "[2, 7]", "10 cached tokens",
                     "n_positions = 16");
  EXPECT_EMBER_ERROR(model.forward(token_ids(3, 1, 2), Tensor(), Tensor(), &cache), "[3, 1]", "batch of 2");
  EXPECT_EMBER_ERROR(model.forward(token_ids(2, 1, 2), ones({2, 1}), Tensor(), &cache), "attention_mask", "[2, 1]",
                     "10 cached tokens");
  EXPECT_EQ(cache.length(), 10) << "a refused call changed the cache";
}

TEST(GPT2GradientCheckpointing, GivesTheSameLossAndGradientsBitForBit) {
  const Tensor ids = token_ids(2, 10, 12);
  auto run = [&](bool checkpointed) {
    manual_seed(13);
    GPT2LMHeadModel model(small_config(/*dropout=*/0.2));
    model.train();
    if (checkpointed) model.gradient_checkpointing_enable();
    EXPECT_EQ(model.is_gradient_checkpointing(), checkpointed);
    manual_seed(14);
    const Tensor loss = model.forward(ids, Tensor(), ids).loss;
    loss.backward();
    std::vector<std::vector<float>> r{loss.to_vector<float>()};
    for (const auto& [name, t] : model.named_parameters()) r.push_back(t.grad().contiguous().to_vector<float>());
    return r;
  };
  const auto plain = run(false), checkpointed = run(true);
  ASSERT_EQ(plain.size(), checkpointed.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(plain[i], checkpointed[i]) << "entry " << i;
}

TEST(GPT2GradientCheckpointing, OnlyWhileTrainingWithGradAndWithoutACache) {
  manual_seed(15);
  GPT2Model model(small_config());
  model.gradient_checkpointing_enable();
  const Tensor ids = token_ids(1, 6, 16);
  EXPECT_TRUE(graph_has(model.forward(ids), "CheckpointBackward"));
  GPT2KVCache cache;
  EXPECT_FALSE(graph_has(model.forward(ids, Tensor(), &cache), "CheckpointBackward"));
  EXPECT_EQ(cache.length(), 6) << "a checkpointed forward bypassed the cache";
  model.eval();
  EXPECT_FALSE(graph_has(model.forward(ids), "CheckpointBackward"));
  model.train();
  {
    NoGradGuard no_grad;
    EXPECT_FALSE(model.forward(ids).requires_grad());
  }
  model.gradient_checkpointing_disable();
  EXPECT_FALSE(model.is_gradient_checkpointing());
  EXPECT_FALSE(graph_has(model.forward(ids), "CheckpointBackward"));
}
