// DistributedDataParallel::overlap_optimizer_step: each bucket's parameters are stepped as soon
// as its average lands, giving the same weights as the ordinary step after backward.
// Threads as ranks over Gloo.
#include <memory>
#include <vector>

#include "ddp_test_model.h"
#include "optim/sgd_adam.h"
#include "test_util.h"
#include "thread_ranks.h"

using namespace ember;
using namespace ember::distributed;
using namespace ember::ddp_test;
using ember::test::expect_no_errors;
using ember::test::run_ranks;

namespace {

// 6 AdamW steps on 2 ranks, three buckets; `overlap`: stepped by DDP during backward.
std::vector<std::vector<float>> train(bool overlap, std::vector<int64_t>* steps_seen = nullptr) {
  std::vector<std::vector<float>> weights(2);
  expect_no_errors(run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = make_mlp(41);
    DistributedDataParallel ddp(model, pg, {.bucket_cap_mb = kSmallBucketMb});
    auto opt = std::make_shared<optim::AdamW>(model->parameters(), optim::AdamWOptions{.lr = 1e-2});
    if (overlap) ddp.overlap_optimizer_step(opt);
    for (int s = 0; s < 6; ++s) {
      auto [x, y] = batch_rows(s, 8, 4 * pg->rank(), 4);
      nn::functional::mse_loss(model->forward(x), y).backward();
      if (!overlap) opt->step();
      opt->zero_grad();
    }
    EXPECT_EQ(ddp.bucket_sizes().size(), 3u);
    weights[size_t(pg->rank())] = flat_parameters(*model);
    if (steps_seen && pg->rank() == 0)
      for (const Tensor& p : model->parameters()) steps_seen->push_back(opt->state(p).step);
  }));
  return weights;
}

}  // namespace

TEST(DDPOptimizerOverlap, SteppingEachBucketAsItLandsGivesTheOrdinaryStep) {
  const auto plain = train(false);
  std::vector<int64_t> steps;
  const auto overlapped = train(true, &steps);
  EXPECT_EQ(overlapped[0], plain[0]);
  EXPECT_EQ(overlapped[1], plain[1]);
  EXPECT_NE(plain[0], flat_parameters(*make_mlp(41)));  // it trained
  EXPECT_EQ(steps, std::vector<int64_t>(steps.size(), 6));  // every parameter once a pass
  EXPECT_EQ(steps.size(), 6u);
}

TEST(DDPOptimizerOverlap, RefusesWhatItCannotOverlap) {
  expect_no_errors(run_ranks(1, [](std::shared_ptr<ProcessGroup> pg) {
    auto model = make_mlp(42);
    DistributedDataParallel ddp(model, pg, {.find_unused_parameters = true});
    auto opt = std::make_shared<optim::AdamW>(model->parameters(), optim::AdamWOptions{});
    EXPECT_EMBER_ERROR(ddp.overlap_optimizer_step(opt), "find_unused_parameters");
    DistributedDataParallel other(make_mlp(43), pg);
    EXPECT_EMBER_ERROR(other.overlap_optimizer_step(nullptr), "null optimizer");
  }));
}

TEST(DDPOptimizerOverlap, StepOnlyLeavesTheOtherParametersAlone) {
  auto model = make_mlp(44);
  optim::AdamW opt(model->parameters(), {.lr = 1e-2});
  auto [x, y] = batch_rows(0, 4, 0, 4);
  nn::functional::mse_loss(model->forward(x), y).backward();
  const auto before = model->fc1->weight.to_vector<float>();
  opt.step_only({model->fc3->weight, model->fc3->bias});
  EXPECT_EQ(model->fc1->weight.to_vector<float>(), before);
  EXPECT_EQ(opt.state(model->fc1->weight).step, 0);
  EXPECT_EQ(opt.state(model->fc3->weight).step, 1);
  EXPECT_EQ(opt.param_groups()[0].params.size(), 6u);  // the group is whole again
}
