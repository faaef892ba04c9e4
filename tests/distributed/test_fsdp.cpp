// Sharded data parallel (every strategy), threads as ranks: the unit layout, and
// N ranks at batch b reaching the weights one rank reaches at batch N*b with AdamW, with
// gradient accumulation and with global-norm clipping.
#include <cmath>

#include "core/grad_mode.h"
#include "ddp_test_model.h"
#include "distributed/fsdp.h"
#include "optim/clip_grad.h"
#include "optim/sgd_adam.h"
#include "test_util.h"
#include "thread_ranks.h"

using namespace ember;
using namespace ember::distributed;
using namespace ember::ddp_test;
using ember::test::expect_no_errors;
using ember::test::run_ranks;

namespace {

FSDPOptions options_for(ShardingStrategy s, AutoWrapPolicy wrap = AutoWrapPolicy::TRANSFORMER_BASED_WRAP) {
  FSDPOptions o;
  o.sharding_strategy = s;
  o.auto_wrap_policy = wrap;
  o.transformer_layer_cls_to_wrap = {"Linear"};
  return o;
}

struct Plan {
  int steps = 5;
  int64_t per_rank_batch = 3;
  int micro_batches = 1;
  double clip = 0;  // > 0: clip the global gradient norm to this before each step
};

constexpr optim::AdamWOptions kAdamW{.lr = 0.02, .weight_decay = 0.01};

// One rank's view of the whole global batch; returns the clip norms it saw.
std::vector<double> train_reference(nn::Module& model, const Plan& plan, int world) {
  optim::AdamW opt(model.parameters(), kAdamW);
  std::vector<double> norms;
  const int64_t global = plan.per_rank_batch * world;
  for (int s = 0; s < plan.steps; ++s) {
    for (int m = 0; m < plan.micro_batches; ++m) {
      auto [x, y] = batch_rows(s * plan.micro_batches + m, global, 0, global);
      (nn::functional::mse_loss(model.forward(x), y) * (1.0 / plan.micro_batches)).backward();
    }
    if (plan.clip > 0) norms.push_back(optim::clip_grad_norm_(model.parameters(), plan.clip));
    opt.step();
    opt.zero_grad();
  }
  return norms;
}

std::vector<double> train_sharded(FullyShardedDataParallel& fsdp, const Plan& plan) {
  auto& model = *fsdp.module();
  const int rank = fsdp.process_group()->rank(), world = fsdp.process_group()->size();
  optim::AdamW opt(fsdp.parameters(), kAdamW);
  std::vector<double> norms;
  const int64_t b = plan.per_rank_batch;
  for (int s = 0; s < plan.steps; ++s) {
    for (int m = 0; m < plan.micro_batches; ++m) {
      fsdp.sync_parameters();
      auto [x, y] = batch_rows(s * plan.micro_batches + m, b * world, b * rank, b);
      Tensor loss = nn::functional::mse_loss(model.forward(x), y) * (1.0 / plan.micro_batches);
      if (m + 1 < plan.micro_batches) {
        auto guard = fsdp.no_sync();
        loss.backward();
      } else {
        loss.backward();
      }
    }
    if (plan.clip > 0) norms.push_back(fsdp.clip_grad_norm_(plan.clip));
    opt.step();
    opt.zero_grad();
  }
  fsdp.sync_parameters();
  return norms;
}

// Trains `world` ranks under `options` and checks every rank against the one-rank reference.
void expect_matches_one_rank(int world, const FSDPOptions& options, const Plan& plan, uint64_t seed) {
  auto reference = make_mlp(seed);
  const std::vector<double> ref_norms = train_reference(*reference, plan, world);
  EXPECT_GT(max_abs_diff(*reference, *make_mlp(seed)), 1e-3) << "training must move the parameters";
  std::vector<double> diffs(size_t(world), -1);
  std::vector<std::vector<double>> norms{size_t(world)};
  expect_no_errors(run_ranks(world, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = make_mlp(seed + uint64_t(pg->rank()));  // rank 0's values are broadcast
    auto fsdp = shard_model(model, pg, options);
    norms[size_t(pg->rank())] = train_sharded(*fsdp, plan);
    auto full = fsdp->summon_full_params(false);  // FULL_SHARD holds shards only
    diffs[size_t(pg->rank())] = max_abs_diff(*model, *reference);
  }));
  for (int r = 0; r < world; ++r) {
    EXPECT_GE(diffs[size_t(r)], 0) << "rank " << r;
    EXPECT_LE(diffs[size_t(r)], 1e-5) << "rank " << r << " of " << world << ", "
                                      << sharding_strategy_name(options.sharding_strategy);
    ASSERT_EQ(norms[size_t(r)].size(), ref_norms.size());
    for (size_t k = 0; k < ref_norms.size(); ++k)
      EXPECT_NEAR(norms[size_t(r)][k], ref_norms[k], 1e-6 * ref_norms[k]) << "rank " << r << " step " << k;
  }
}

const ShardingStrategy kStrategies[] = {ShardingStrategy::NO_SHARD, ShardingStrategy::SHARD_OPTIMIZER,
                                        ShardingStrategy::SHARD_GRAD_OP, ShardingStrategy::FULL_SHARD};

// Two children that share one weight; the second also has a bias of its own.
class Holder : public nn::Module {
 public:
  Holder(const Tensor& weight, bool with_bias) : Module("Holder") {
    register_parameter("weight", weight);
    if (with_bias) register_parameter("bias", zeros({4}));
  }
};
class Tied : public nn::Module {
 public:
  Tied() : Module("Tied") {
    Tensor w = randn({4, 4});
    register_module("a", std::make_shared<Holder>(w, false));
    register_module("b", std::make_shared<Holder>(w, true));
  }
};

}  // namespace

TEST(FSDPLayout, UnitsFollowTheWrapPolicyAndPadToTheWorldSize) {
  auto model = make_mlp(1);  // fc1 6x16+16 = 112, fc2 16x16+16 = 272, fc3 16x3+3 = 51
  auto units = plan_units(*model, options_for(ShardingStrategy::SHARD_GRAD_OP), 3);
  ASSERT_EQ(units.size(), 3u);
  EXPECT_EQ(units[0].name, "fc1");
  EXPECT_EQ(units[1].name, "fc2");
  EXPECT_EQ(units[2].name, "fc3");
  EXPECT_EQ(units[2].numel, 51);
  EXPECT_EQ(units[2].padded_numel, 51);
  EXPECT_EQ(units[0].padded_numel, 114);  // 112 rounded up to a multiple of 3
  EXPECT_EQ(units[0].shard_numel, 38);
  EXPECT_EQ(units[0].params[1].name, "fc1.bias");
  EXPECT_EQ(units[0].params[1].offset, 96);
  // Rank 2 owns [76, 114): the last 20 weights and all 16 biases (the 2 padding elements aside).
  EXPECT_EQ(units[0].overlap(0, 76, 114), (std::pair<int64_t, int64_t>{76, 20}));
  EXPECT_EQ(units[0].overlap(1, 76, 114), (std::pair<int64_t, int64_t>{0, 16}));
  EXPECT_EQ(units[0].overlap(1, 0, 38), (std::pair<int64_t, int64_t>{0, 0}));

  // Size-based: fc2 alone reaches 200; fc1 and fc3 stay in the root unit.
  FSDPOptions by_size = options_for(ShardingStrategy::SHARD_GRAD_OP, AutoWrapPolicy::SIZE_BASED_WRAP);
  by_size.min_num_params = 200;
  units = plan_units(*model, by_size, 4);
  ASSERT_EQ(units.size(), 2u);
  EXPECT_EQ(units[0].display_name(), "(root)");
  EXPECT_EQ(units[0].numel, 112 + 51);
  EXPECT_EQ(units[0].padded_numel, 164);
  EXPECT_EQ(units[1].name, "fc2");

  units = plan_units(*model, options_for(ShardingStrategy::SHARD_GRAD_OP, AutoWrapPolicy::NO_WRAP), 2);
  ASSERT_EQ(units.size(), 1u);
  EXPECT_EQ(units[0].numel, 112 + 272 + 51);
  EXPECT_EQ(units[0].padded_numel, 436);

  // A weight tied between two wrapped modules belongs to their common ancestor, the root; a
  // wrapped module left without parameters is no unit.
  Tied tied;
  FSDPOptions holders = options_for(ShardingStrategy::SHARD_GRAD_OP);
  holders.transformer_layer_cls_to_wrap = {"Holder"};
  units = plan_units(tied, holders, 2);
  ASSERT_EQ(units.size(), 2u);
  EXPECT_EQ(units[0].display_name(), "(root)");
  ASSERT_EQ(units[0].params.size(), 1u);
  EXPECT_EQ(units[0].params[0].name, "a.weight");
  EXPECT_EQ(units[1].name, "b");
  ASSERT_EQ(units[1].params.size(), 1u);
  EXPECT_EQ(units[1].params[0].name, "b.bias");

  // A unit smaller than the world still gives every rank a shard.
  units = plan_units(*model, options_for(ShardingStrategy::SHARD_GRAD_OP), 64);
  EXPECT_EQ(units[2].padded_numel, 64);
  EXPECT_EQ(units[2].shard_numel, 1);
}

TEST(FSDPLayout, RefusesWhatItCannotShard) {
  auto model = make_mlp(2);
  FSDPOptions no_names = options_for(ShardingStrategy::SHARD_GRAD_OP);
  no_names.transformer_layer_cls_to_wrap.clear();
  EXPECT_EMBER_ERROR(plan_units(*model, no_names, 2), "transformer_layer_cls_to_wrap");
  model->fc2->to(DType::f64);
  EXPECT_EMBER_ERROR(plan_units(*model, options_for(ShardingStrategy::SHARD_GRAD_OP), 2), "'fc2.weight' is float64");
  EXPECT_EMBER_ERROR(parse_sharding_strategy("1"), "stage 1 = SHARD_OPTIMIZER");
  EXPECT_EMBER_ERROR(parse_sharding_strategy("ZERO"), "unknown sharding strategy 'ZERO'");
  EXPECT_EQ(parse_sharding_strategy("shard_grad_op"), ShardingStrategy::SHARD_GRAD_OP);
  expect_no_errors(run_ranks(1, [](std::shared_ptr<ProcessGroup> pg) {
    FSDPOptions bf16 = options_for(ShardingStrategy::SHARD_GRAD_OP);
    bf16.mixed_precision.param_dtype = DType::bf16;
    EXPECT_EMBER_ERROR(shard_model(make_mlp(3), pg, bf16), "autocast");
  }));
}

TEST(FSDP, ShardViewsCoverEachParameterOnceAcrossRanks) {
  const int world = 3;
  auto model_numel = make_mlp(4)->num_parameters();
  std::vector<int64_t> owned(world, 0);
  expect_no_errors(run_ranks(world, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = make_mlp(4);
    auto fsdp = shard_model(model, pg, options_for(ShardingStrategy::SHARD_GRAD_OP));
    int64_t n = 0;
    for (auto& v : fsdp->parameters()) {
      EXPECT_TRUE(v.is_leaf() && v.requires_grad());
      EXPECT_EQ(v.dim(), 1);
      n += v.numel();
    }
    owned[size_t(pg->rank())] = n;
    EXPECT_EQ(fsdp->unit_names(), (std::vector<std::string>{"fc1", "fc2", "fc3"}));
    EXPECT_EQ(fsdp->sharded({model->fc3->parameter("bias")}).size(), 1u);
    EXPECT_EMBER_ERROR(fsdp->sharded({zeros({2})}), "not a trainable parameter");
  }));
  EXPECT_EQ(owned[0] + owned[1] + owned[2], model_numel);
}

TEST(FSDP, EveryStrategyOnTwoAndThreeRanksMatchesOneRank) {
  uint64_t seed = 20;
  for (ShardingStrategy s : kStrategies)
    for (int world : {2, 3}) expect_matches_one_rank(world, options_for(s), Plan{}, seed++);
}

TEST(FSDP, AccumulationUnderNoSyncAndGlobalClippingMatchOneRank) {
  Plan plan;
  plan.steps = 3;
  plan.micro_batches = 2;
  plan.clip = 0.05;  // small enough to clip every step
  uint64_t seed = 40;
  for (ShardingStrategy s : kStrategies)
    expect_matches_one_rank(3, options_for(s, AutoWrapPolicy::NO_WRAP), plan, seed++);
}

TEST(FSDP, Bf16ReductionsStayCloseToOneRank) {
  FSDPOptions o = options_for(ShardingStrategy::SHARD_GRAD_OP);
  o.mixed_precision.reduce_dtype = DType::bf16;
  auto reference = make_mlp(60);
  train_reference(*reference, Plan{}, 2);
  std::vector<double> diffs(2, -1);
  expect_no_errors(run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = make_mlp(60);
    auto fsdp = shard_model(model, pg, o);
    train_sharded(*fsdp, Plan{});
    diffs[size_t(pg->rank())] = max_abs_diff(*model, *reference);
    EXPECT_EQ(fsdp->comm_stats().bytes_reduced, 5 * 2 * (112 + 272 + 52));  // bf16, each unit padded to even
  }));
  for (double d : diffs) {
    EXPECT_GE(d, 0);
    EXPECT_LE(d, 2e-2);
  }
}

TEST(FSDP, ShardGradOpKeepsOnlyTheShardGradient) {
  expect_no_errors(run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
    for (ShardingStrategy s : {ShardingStrategy::SHARD_GRAD_OP, ShardingStrategy::SHARD_OPTIMIZER,
                               ShardingStrategy::FULL_SHARD}) {
      auto model = make_mlp(70);
      auto fsdp = shard_model(model, pg, options_for(s));
      auto [x, y] = batch_rows(0, 4, 2 * pg->rank(), 2);
      nn::functional::mse_loss(model->forward(x), y).backward();
      for (auto& [name, p] : model->named_parameters()) {
        if (s != ShardingStrategy::SHARD_OPTIMIZER) {
          EXPECT_FALSE(p.grad().defined()) << name;
        } else {
          // Stage 1 keeps the full gradient buffer, zeroed once its shard was taken.
          ASSERT_TRUE(p.grad().defined()) << name;
          EXPECT_EQ(sum(abs(p.grad())).item<double>(), 0.0) << name;
        }
      }
      for (auto& v : fsdp->parameters()) {
        EXPECT_EQ(v.grad().defined(), v.numel() > 0);
      }
    }
  }));
}

TEST(FSDP, DestroyingTheWrapperRemovesItsHooks) {
  expect_no_errors(run_ranks(1, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = make_mlp(80);
    for (int k = 0; k < 20; ++k) shard_model(model, pg, options_for(ShardingStrategy::SHARD_GRAD_OP));
    for (auto& p : model->parameters()) EXPECT_EQ(p.hook_count(), 0u);
    EXPECT_EQ(model->forward_hook_count(), 0u);
    // Afterwards plain training computes local gradients again.
    auto [x, y] = batch_rows(0, 2, 0, 2);
    nn::functional::mse_loss(model->forward(x), y).backward();
    for (auto& p : model->parameters()) EXPECT_TRUE(p.grad().defined());
  }));
}

TEST(FSDP, TheModelsForwardGathersWhatTheLastStepUpdated) {
  // A Sequential opens the forward scope its pre-hooks run in: no sync_parameters() call needed.
  auto make = [](uint64_t seed) {
    auto m = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Linear>(kIn, kHidden), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(kHidden, kOut)});
    fill_deterministic(*m, seed);
    return m;
  };
  const int world = 3, steps = 4;
  const int64_t b = 2;
  auto reference = make(90);
  {
    optim::AdamW opt(reference->parameters(), kAdamW);
    for (int k = 0; k < steps; ++k) {
      auto [x, y] = batch_rows(k, b * world, 0, b * world);
      nn::functional::mse_loss(reference->forward(x), y).backward();
      opt.step();
      opt.zero_grad();
    }
  }
  std::vector<double> diffs(world, -1);
  expect_no_errors(run_ranks(world, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = make(90);
    auto fsdp = shard_model(model, pg, options_for(ShardingStrategy::SHARD_GRAD_OP));
    optim::AdamW opt(fsdp->parameters(), kAdamW);
    for (int k = 0; k < steps; ++k) {
      auto [x, y] = batch_rows(k, b * world, b * pg->rank(), b);
      nn::functional::mse_loss(model->forward(x), y).backward();
      opt.step();
      opt.zero_grad();
    }
    Tensor probe = zeros({1, kIn});
    model->forward(probe);  // the last step's gather
    diffs[size_t(pg->rank())] = max_abs_diff(*model, *reference);
    EXPECT_EQ(fsdp->bytes_gathered(), steps * 4 * (114 + 51));  // every unit once per step, 112 padded to 114
  }));
  for (double d : diffs) {
    EXPECT_GE(d, 0);
    EXPECT_LE(d, 1e-5);
  }
}
