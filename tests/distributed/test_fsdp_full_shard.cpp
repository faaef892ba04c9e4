// FULL_SHARD (stage 3), threads as ranks: parameters hold memory only while their unit runs,
// summon_full_params and full_state_dict give the whole values, evaluation frees everything,
// a BERT under activation checkpointing trains like one rank on the whole batch, and a bf16/f16
// param_dtype gathers and computes in it over f32 master shards.
#include <cmath>
#include <optional>
#include <vector>

#include "core/autocast.h"
#include "core/grad_mode.h"
#include "ddp_test_model.h"
#include "distributed/fsdp.h"
#include "nn/models/bert.h"
#include "optim/sgd_adam.h"
#include "test_util.h"
#include "thread_ranks.h"

using namespace ember;
using namespace ember::distributed;
using namespace ember::ddp_test;
using ember::test::expect_no_errors;
using ember::test::run_ranks;

namespace {

FSDPOptions full_shard(std::vector<std::string> wrap = {"Linear"}) {
  FSDPOptions o;
  o.sharding_strategy = ShardingStrategy::FULL_SHARD;
  o.transformer_layer_cls_to_wrap = std::move(wrap);
  return o;
}

std::vector<bool> gathered(const FullyShardedDataParallel& f) {
  std::vector<bool> out;
  for (size_t u = 0; u < f.units().size(); ++u) out.push_back(f.unit_gathered(u));
  return out;
}

const std::vector<bool> kNoneGathered{false, false, false};

}  // namespace

TEST(FSDPFullShard, ParametersHoldMemoryOnlyWhileTheirUnitRuns) {
  expect_no_errors(run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = make_mlp(100);
    auto fsdp = shard_model(model, pg, full_shard());
    EXPECT_EQ(gathered(*fsdp), kNoneGathered);
    EXPECT_EMBER_ERROR(sum(model->fc1->parameter("weight")).item<double>(), "memory was released");
    // Hooks registered after the wrapper's run after its own: they see what the unit sees.
    std::vector<std::vector<bool>> seen;
    model->fc2->register_forward_pre_hook([&](nn::Module&) { seen.push_back(gathered(*fsdp)); });
    model->fc3->register_forward_pre_hook([&](nn::Module&) { seen.push_back(gathered(*fsdp)); });
    auto [x, y] = batch_rows(0, 4, 2 * pg->rank(), 2);
    Tensor loss = nn::functional::mse_loss(model->forward(x), y);
    ASSERT_EQ(seen.size(), 2u);
    // fc1 was freed after its forward; fc2 is gathered (fc3's gather may still be in flight).
    EXPECT_FALSE(seen[0][0]);
    EXPECT_TRUE(seen[0][1]);
    EXPECT_EQ(seen[1][0], false);
    EXPECT_EQ(seen[1][1], false);
    EXPECT_TRUE(seen[1][2]);
    loss.backward();
    EXPECT_EQ(gathered(*fsdp), kNoneGathered);
    for (auto& v : fsdp->parameters()) EXPECT_EQ(v.grad().defined(), v.numel() > 0);
    for (auto& p : model->parameters()) EXPECT_FALSE(p.grad().defined());
    // Every unit was gathered twice: before its forward and before its backward.
    EXPECT_EQ(fsdp->bytes_gathered(), 2 * 4 * (112 + 272 + 52));
  }));
}

TEST(FSDPFullShard, SummonFullParamsWritesBackOnlyWhenAsked) {
  expect_no_errors(run_ranks(3, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = make_mlp(110);
    auto reference = make_mlp(110);
    auto fsdp = shard_model(model, pg, full_shard());
    {
      auto full = fsdp->summon_full_params(false);
      EXPECT_EQ(max_abs_diff(*model, *reference), 0.0);
      NoGradGuard no_grad;
      model->fc3->parameter("bias").fill_(9.0);  // dropped: no writeback
    }
    EXPECT_EQ(gathered(*fsdp), kNoneGathered);
    {
      auto full = fsdp->summon_full_params();
      EXPECT_EQ(max_abs_diff(*model, *reference), 0.0);
      NoGradGuard no_grad;
      model->fc3->parameter("bias").fill_(0.5);
      reference->fc3->parameter("bias").fill_(0.5);
    }
    auto state = fsdp->full_state_dict();
    EXPECT_EQ(gathered(*fsdp), kNoneGathered);
    auto ref_state = reference->state_dict();
    ASSERT_EQ(state.size(), ref_state.size());
    for (const auto& [name, value] : state) {
      ASSERT_TRUE(ref_state.count(name)) << name;
      EXPECT_EQ((value - ref_state.at(name)).abs().max().item<double>(), 0.0) << name;
    }
    // The next forward computes with the written-back bias.
    NoGradGuard no_grad;
    auto [x, y] = batch_rows(0, 3, 0, 3);
    EXPECT_EQ((model->forward(x) - reference->forward(x)).abs().max().item<double>(), 0.0);
  }));
}

TEST(FSDPFullShard, EvaluationWithoutGradFreesEveryUnit) {
  expect_no_errors(run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
    // A Sequential opens a forward scope, so the root unit's own hooks run too.
    auto make = [] {
      auto m = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
          std::make_shared<nn::Linear>(kIn, kHidden), std::make_shared<nn::ReLU>(),
          std::make_shared<nn::Linear>(kHidden, kOut)});
      fill_deterministic(*m, 120);
      return m;
    };
    auto model = make(), reference = make();
    FSDPOptions o = full_shard();
    o.auto_wrap_policy = AutoWrapPolicy::NO_WRAP;  // one root unit, which keeps its memory through backward
    auto fsdp = shard_model(model, pg, o);
    auto [x, y] = batch_rows(1, 2, 0, 2);
    {
      NoGradGuard no_grad;
      EXPECT_EQ((model->forward(x) - reference->forward(x)).abs().max().item<double>(), 0.0);
    }
    EXPECT_FALSE(fsdp->unit_gathered(0));
    Tensor out = model->forward(x);
    EXPECT_TRUE(fsdp->unit_gathered(0));
    sum(out).backward();
    EXPECT_FALSE(fsdp->unit_gathered(0));
  }));
}

namespace {

nn::BertConfig tiny_bert() {
  nn::BertConfig c = nn::BertConfig::tiny(96);
  c.hidden_size = 32;
  c.num_attention_heads = 2;
  c.intermediate_size = 64;
  c.max_position_embeddings = 16;
  c.hidden_dropout_prob = 0.0;  // ranks draw different dropout masks than the one-rank run
  c.attention_probs_dropout_prob = 0.0;
  return c;
}

std::shared_ptr<nn::BertForMaskedLM> make_bert() {
  manual_seed(7);
  return std::make_shared<nn::BertForMaskedLM>(tiny_bert());
}

// Rows [first, first + count) of the global MLM batch of step `s`.
std::pair<Tensor, Tensor> mlm_rows(int s, int64_t global, int64_t first, int64_t count) {
  const int64_t len = 12;
  std::vector<int64_t> ids, labels;
  for (int64_t r = 0; r < global; ++r)
    for (int64_t t = 0; t < len; ++t) {
      const int64_t v = (s * 31 + r * 17 + t * 7) % 96;
      ids.push_back(v);
      labels.push_back((r + t + s) % 3 == 0 ? (v * 5 + 1) % 96 : -100);
    }
  Tensor i = from_vector<int64_t>(ids, {global, len}), l = from_vector<int64_t>(labels, {global, len});
  return {i.narrow(0, first, count).contiguous(), l.narrow(0, first, count).contiguous()};
}

double scored(const Tensor& labels) {
  double n = 0;
  for (int64_t v : labels.to_vector<int64_t>()) n += v != -100;
  return n;
}

}  // namespace

TEST(FSDPFullShard, BertWithActivationCheckpointingMatchesOneRank) {
  const int world = 2, steps = 3;
  const int64_t b = 2;
  const optim::AdamWOptions adamw{.lr = 1e-3, .weight_decay = 0.01};
  auto reference = make_bert();
  {
    optim::AdamW opt(reference->parameters(), adamw);
    for (int s = 0; s < steps; ++s) {
      auto [ids, labels] = mlm_rows(s, b * world, 0, b * world);
      reference->forward(ids, Tensor(), Tensor(), labels).loss.backward();
      opt.step();
      opt.zero_grad();
    }
  }
  std::vector<double> diffs(world, -1);
  // Built here: the generator that initialises them is one for the whole process.
  std::vector<std::shared_ptr<nn::BertForMaskedLM>> models;
  for (int r = 0; r < world; ++r) models.push_back(make_bert());
  expect_no_errors(run_ranks(world, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = models[size_t(pg->rank())];
    FSDPOptions o = full_shard({"BertLayer"});
    o.activation_checkpointing = true;
    auto fsdp = shard_model(model, pg, o);
    EXPECT_TRUE(model->is_gradient_checkpointing());
    EXPECT_EQ(fsdp->unit_names(), (std::vector<std::string>{"(root)", "bert.encoder.layer.0", "bert.encoder.layer.1"}));
    optim::AdamW opt(fsdp->parameters(), adamw);
    for (int s = 0; s < steps; ++s) {
      // Scored positions differ between the halves of the batch: average per token the way
      // the one-rank loss does by scaling with this rank's share of the scored positions.
      auto [ids, labels] = mlm_rows(s, b * world, b * pg->rank(), b);
      auto [all_ids, all_labels] = mlm_rows(s, b * world, 0, b * world);
      const double mine = scored(labels), total = scored(all_labels);
      Tensor loss = model->forward(ids, Tensor(), Tensor(), labels).loss * (mine * world / total);
      loss.backward();
      EXPECT_EQ(gathered(*fsdp), (std::vector<bool>{false, false, false}));
      opt.step();
      opt.zero_grad();
    }
    auto full = fsdp->summon_full_params(false);
    diffs[size_t(pg->rank())] = max_abs_diff(*model, *reference);
  }));
  for (double d : diffs) {
    EXPECT_GE(d, 0);
    EXPECT_LE(d, 1e-5);
  }
}

TEST(FSDPFullShard, ActivationCheckpointingNeedsAModelThatSupportsIt) {
  expect_no_errors(run_ranks(1, [&](std::shared_ptr<ProcessGroup> pg) {
    FSDPOptions o = full_shard();
    o.activation_checkpointing = true;
    EXPECT_EMBER_ERROR(shard_model(make_mlp(130), pg, o), "Mlp has no gradient_checkpointing_enable()");
  }));
}

namespace {

// Trains `model` (wrapped or not) `steps` AdamW steps on its rows of batch_rows, under
// autocast to `compute` when given.
void train_mlp(nn::Module& model, const std::vector<Tensor>& params, int steps, int64_t global, int64_t first,
               int64_t count, std::optional<DType> compute) {
  optim::AdamW opt(params, {.lr = 1e-2});
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = batch_rows(s, global, first, count);
    Tensor loss;
    {
      std::optional<AutocastGuard> amp;
      if (compute) amp.emplace(DeviceType::CPU, *compute);
      loss = nn::functional::mse_loss(model.forward(x), y);
    }
    opt.zero_grad();  // before, not after: the last step's gradients stay to be read
    loss.backward();
    opt.step();
  }
}

}  // namespace

TEST(FSDPFullShard, LowerParamDtypeGathersAndComputesInItAndKeepsF32Masters) {
  for (DType pd : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(pd));
    const int world = 2, steps = 4;
    const int64_t b = 3;
    auto reference = make_mlp(140);
    train_mlp(*reference, reference->parameters(), steps, b * world, 0, b * world, pd);
    std::vector<double> diffs(world, -1);
    expect_no_errors(run_ranks(world, [&](std::shared_ptr<ProcessGroup> pg) {
      auto model = make_mlp(140);
      FSDPOptions o = full_shard();
      o.mixed_precision.param_dtype = pd;
      auto fsdp = shard_model(model, pg, o);
      std::vector<DType> seen;
      model->fc2->register_forward_pre_hook([&](nn::Module& m) { seen.push_back(m.parameter("weight").dtype()); });
      for (auto& v : fsdp->parameters()) EXPECT_EQ(v.dtype(), DType::f32);  // the masters
      train_mlp(*model, fsdp->parameters(), steps, b * world, b * pg->rank(), b, pd);
      EXPECT_EQ(seen, std::vector<DType>(steps, pd));
      // Two gathers per unit and step, in 2-byte elements.
      EXPECT_EQ(fsdp->bytes_gathered(), int64_t(steps) * 2 * 2 * (112 + 272 + 52));
      EXPECT_EQ(gathered(*fsdp), kNoneGathered);
      for (auto& v : fsdp->parameters())
        if (v.numel() > 0) {
          EXPECT_EQ(v.grad().dtype(), DType::f32);
        }
      {
        // summon_full_params shows the f32 masters, not the compute copy, and writes back exactly.
        auto full = fsdp->summon_full_params();
        EXPECT_EQ(model->fc1->parameter("weight").dtype(), DType::f32);
        diffs[size_t(pg->rank())] = max_abs_diff(*model, *reference);
        NoGradGuard no_grad;
        model->fc3->parameter("bias").fill_(0.1234567);
      }
      EXPECT_EQ(model->fc1->parameter("weight").dtype(), pd);
      EXPECT_EQ(gathered(*fsdp), kNoneGathered);
      auto state = fsdp->full_state_dict();
      for (const auto& [name, value] : state)
        if (name == "fc3.bias") {
          EXPECT_EQ((value - 0.1234567f).abs().max().item<double>(), 0.0);
        }
    }));
    // The one-rank run casts the same f32 weights to the same dtype; the sums differ in order.
    for (double d : diffs) {
      EXPECT_GE(d, 0);
      EXPECT_LE(d, 1e-2);
    }
  }
}

TEST(FSDPFullShard, LowerParamDtypeOnlyUnderFullShard) {
  expect_no_errors(run_ranks(1, [](std::shared_ptr<ProcessGroup> pg) {
    FSDPOptions o = full_shard();
    o.mixed_precision.param_dtype = DType::f64;
    EXPECT_EMBER_ERROR(shard_model(make_mlp(3), pg, o), "param_dtype must be f32, bf16 or f16, got float64");
    o.mixed_precision.param_dtype = DType::bf16;
    o.sharding_strategy = ShardingStrategy::SHARD_OPTIMIZER;
    EXPECT_EMBER_ERROR(shard_model(make_mlp(3), pg, o), "only FULL_SHARD gathers a lower-precision compute copy");
  }));
}

TEST(FSDPFullShard, BertRecomputesUnderAutocastWithABf16ParamDtype) {
  // The recompute of a checkpointed unit runs inside backward, where autocast is off, and
  // must see the forward's autocast again (ember::checkpoint restores it).
  const int world = 2;
  const int64_t b = 2;
  std::vector<std::shared_ptr<nn::BertForMaskedLM>> models;
  for (int r = 0; r < world; ++r) models.push_back(make_bert());
  std::vector<std::vector<double>> losses(world);
  expect_no_errors(run_ranks(world, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = models[size_t(pg->rank())];
    FSDPOptions o = full_shard({"BertLayer"});
    o.activation_checkpointing = true;
    o.mixed_precision.param_dtype = DType::bf16;
    auto fsdp = shard_model(model, pg, o);
    optim::AdamW opt(fsdp->parameters(), {.lr = 1e-3});
    auto [ids, labels] = mlm_rows(0, b * world, b * pg->rank(), b);
    EXPECT_EMBER_ERROR(model->forward(ids, Tensor(), Tensor(), labels), "AutocastGuard(DeviceType::CPU, bfloat16)");
    for (int s = 0; s < 3; ++s) {
      Tensor loss;
      {
        AutocastGuard amp(DeviceType::CPU, DType::bf16);
        loss = model->forward(ids, Tensor(), Tensor(), labels).loss;
      }
      loss.backward();
      for (auto& v : fsdp->parameters())
        if (v.numel() > 0) {
          EXPECT_TRUE(v.grad().defined() && v.grad().dtype() == DType::f32);
        }
      opt.step();
      opt.zero_grad();
      losses[size_t(pg->rank())].push_back(loss.item<double>());
    }
  }));
  // The same batch three times: the steps the shards took lower its loss.
  for (const auto& l : losses) {
    ASSERT_EQ(l.size(), 3u);
    EXPECT_TRUE(std::isfinite(l[0]));
    EXPECT_LT(l[2], l[0]);
  }
}
