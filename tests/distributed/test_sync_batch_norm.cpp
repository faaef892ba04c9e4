// SyncBatchNorm and convert_sync_batchnorm. In one process (no group, or a group of one rank)
// the layer is BatchNorm2d bit for bit; convert_sync_batchnorm swaps batch norms at any depth
// for layers holding the very same tensors. Over real processes (tests/programs/syncbn_worker):
// 2 and 3 ranks with equal, unequal, single-sample and empty batches equal one process on the
// whole batch, and so do second-order gradients (a gradient penalty) with halves of a batch and
// with an empty rank; a rank with another channel count fails on every rank; an
// Accelerator-prepared model trains as one process does.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bitwise_snapshot.h"
#include "distributed/default_process_group.h"
#include "distributed/hash_store.h"
#include "distributed/sync_batch_norm.h"
#include "nn/layers/basic.h"
#include "nn/layers/containers.h"
#include "process_test_util.h"
#include "test_util.h"

using namespace ember;
using ember::testing::tensor_bytes;

namespace {

struct StepResult {
  std::vector<ember::testing::TensorBytes> values;  // output, input gradient, parameter gradients, buffers
};

// Two training steps and an evaluation forward; every value the layer produced, bytewise.
StepResult run_steps(nn::BatchNormBase& bn) {
  StepResult r;
  {
    NoGradGuard no_grad;
    bn.weight.copy_(ember::testing::random_tensor({4}));
    bn.bias.copy_(ember::testing::random_tensor({4}));
  }
  for (int step = 0; step < 2; ++step) {
    ember::testing::rng().seed(10 + uint64_t(step));
    Tensor x = ember::testing::random_tensor({3, 4, 2, 5}).requires_grad_(true);
    const Tensor g = ember::testing::random_tensor({3, 4, 2, 5});
    Tensor y = bn.forward(x);
    (y * g).sum().backward();
    for (const Tensor& t : {y, x.grad(), bn.weight.grad(), bn.bias.grad()}) r.values.push_back(tensor_bytes(t));
    bn.zero_grad();
  }
  for (const auto& [name, t] : bn.named_buffers()) r.values.push_back(tensor_bytes(t));
  bn.eval();
  r.values.push_back(tensor_bytes(bn.forward(ember::testing::random_tensor({2, 4, 2, 5}))));
  return r;
}

StepResult batch_norm_2d_steps() {
  ember::testing::rng().seed(7);
  nn::BatchNorm2d bn(4);
  return run_steps(bn);
}

std::vector<std::string> keys_of(const nn::StateDict& sd) {
  std::vector<std::string> out;
  for (const auto& [k, t] : sd) out.push_back(k);
  return out;
}

}  // namespace

TEST(SyncBatchNorm, WithoutAGroupItIsBatchNorm2dBitForBit) {
  distributed::set_default_process_group(nullptr);
  const StepResult want = batch_norm_2d_steps();
  ember::testing::rng().seed(7);
  nn::SyncBatchNorm sync(4);
  EXPECT_EQ(sync.process_group(), nullptr);
  EXPECT_TRUE(run_steps(sync).values == want.values);
}

TEST(SyncBatchNorm, AOneRankGroupRunsNoCollectiveAndIsBatchNorm2dBitForBit) {
  auto pg = distributed::new_process_group(std::make_shared<distributed::HashStore>(), 0, 1, "gloo");
  const StepResult want = batch_norm_2d_steps();
  ember::testing::rng().seed(7);
  nn::SyncBatchNorm sync(4, {}, pg);
  EXPECT_EQ(sync.process_group(), pg);
  EXPECT_TRUE(run_steps(sync).values == want.values);
}

TEST(SyncBatchNorm, TheDefaultGroupIsReadAtEachForwardAndAnExplicitOneWins) {
  auto a = distributed::new_process_group(std::make_shared<distributed::HashStore>(), 0, 1, "gloo");
  auto b = distributed::new_process_group(std::make_shared<distributed::HashStore>(), 0, 1, "gloo");
  nn::SyncBatchNorm by_default(2), named(2, {}, b);
  distributed::set_default_process_group(a);
  EXPECT_EQ(by_default.process_group(), a);
  EXPECT_EQ(named.process_group(), b);
  distributed::set_default_process_group(nullptr);
  EXPECT_EQ(by_default.process_group(), nullptr);
}

TEST(SyncBatchNorm, NamesAndErrors) {
  nn::SyncBatchNorm sync(3);
  nn::BatchNorm1d bn(3);
  EXPECT_EQ(sync.type_name(), "SyncBatchNorm");
  EXPECT_EQ(keys_of(sync.state_dict()), keys_of(bn.state_dict()));
  EXPECT_EMBER_ERROR(sync.forward(zeros({3})), "SyncBatchNorm", "2 or more dims", "1D");
  EXPECT_EMBER_ERROR(sync.forward(zeros({2, 4, 5})), "batch_norm", "4 channels");
  EXPECT_EMBER_ERROR(nn::SyncBatchNorm(0), "SyncBatchNorm", "num_features");
  // [N, C, *] of any rank, as torch
  EXPECT_EQ(sync.forward(ember::testing::random_tensor({2, 3, 2, 2, 2})).shape(), (Shape{2, 3, 2, 2, 2}));
}

TEST(ConvertSyncBatchnorm, ReplacesBatchNormsAtAnyDepthKeepingTheirTensors) {
  auto inner = std::make_shared<nn::Sequential>(
      std::vector<std::shared_ptr<nn::Module>>{std::make_shared<nn::BatchNorm2d>(3), std::make_shared<nn::ReLU>()});
  auto list = std::make_shared<nn::ModuleList>();
  list->push_back(std::make_shared<nn::BatchNorm1d>(5, nn::BatchNormOptions{.momentum = std::nullopt}));
  list->push_back(inner);
  auto model = std::make_shared<nn::Module>();
  model->register_module("fc", std::make_shared<nn::Linear>(4, 5));
  model->register_module("blocks", list);
  auto frozen = std::make_shared<nn::BatchNorm1d>(5);
  frozen->weight.requires_grad_(false);
  model->register_module("frozen", frozen);
  model->eval();
  list->train();  // modes are per layer: blocks.* train, the rest evaluates

  const std::vector<Tensor> params_before = model->parameters();
  const auto buffers_before = model->named_buffers();
  const nn::StateDict state_before = model->state_dict();
  auto pg = distributed::new_process_group(std::make_shared<distributed::HashStore>(), 0, 1, "gloo");
  EXPECT_EQ(nn::convert_sync_batchnorm(model, pg), model);

  std::map<std::string, std::string> types;
  for (const auto& [name, m] : model->named_modules()) types[name] = m->type_name();
  EXPECT_EQ(types["blocks.0"], "SyncBatchNorm");
  EXPECT_EQ(types["blocks.1.0"], "SyncBatchNorm");
  EXPECT_EQ(types["frozen"], "SyncBatchNorm");
  EXPECT_EQ(types["fc"], "Linear");
  auto converted = std::dynamic_pointer_cast<nn::SyncBatchNorm>((*list)[0]);
  ASSERT_NE(converted, nullptr);
  EXPECT_EQ((*inner)[0]->type_name(), "SyncBatchNorm");  // the Sequential runs the new layer
  EXPECT_EQ(converted->process_group(), pg);
  EXPECT_FALSE(converted->options.momentum.has_value());
  EXPECT_TRUE(converted->is_training());
  auto frozen_sync = std::dynamic_pointer_cast<nn::SyncBatchNorm>(model->named_children()[2].second);
  ASSERT_NE(frozen_sync, nullptr);
  EXPECT_FALSE(frozen_sync->is_training());
  EXPECT_FALSE(frozen_sync->weight.requires_grad());
  EXPECT_TRUE(frozen_sync->bias.requires_grad());

  // the very same tensors: an optimizer built before sees the converted layers
  const std::vector<Tensor> params_after = model->parameters();
  ASSERT_EQ(params_after.size(), params_before.size());
  for (size_t i = 0; i < params_after.size(); ++i) EXPECT_EQ(params_after[i].impl(), params_before[i].impl()) << i;
  const auto buffers_after = model->named_buffers();
  ASSERT_EQ(buffers_after.size(), buffers_before.size());
  for (size_t i = 0; i < buffers_after.size(); ++i) {
    EXPECT_EQ(buffers_after[i].first, buffers_before[i].first);
    EXPECT_EQ(buffers_after[i].second.impl(), buffers_before[i].second.impl()) << buffers_after[i].first;
  }
  const nn::StateDict state_after = model->state_dict();
  ASSERT_EQ(keys_of(state_after), keys_of(state_before));
  for (const auto& [k, t] : state_after) EXPECT_EQ(t.raw_data(), state_before.at(k).raw_data()) << k;
}

TEST(ConvertSyncBatchnorm, ARootBatchNormIsReturnedConvertedAndSyncLayersStay) {
  auto bn = std::make_shared<nn::BatchNorm2d>(2);
  auto converted = nn::convert_sync_batchnorm(bn);
  ASSERT_NE(converted, bn);
  EXPECT_EQ(converted->type_name(), "SyncBatchNorm");
  EXPECT_EQ(converted->named_parameters()[0].second.impl(), bn->weight.impl());
  EXPECT_EQ(nn::convert_sync_batchnorm(converted), converted);

  // one layer under two parents becomes one SyncBatchNorm
  auto shared = std::make_shared<nn::BatchNorm1d>(3);
  auto seq = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{shared, shared});
  nn::convert_sync_batchnorm(seq);
  EXPECT_EQ((*seq)[0], (*seq)[1]);
  EXPECT_EQ((*seq)[0]->type_name(), "SyncBatchNorm");
}

namespace {
// A model that calls its batch norm through a member and does not re-point it.
class MemberModel : public nn::Module {
 public:
  MemberModel() : Module("MemberModel") {
    head = register_module("head", std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
                                       std::make_shared<nn::BatchNorm1d>(2)}));
    bn = register_module("bn", std::make_shared<nn::BatchNorm1d>(2));
  }
  Tensor forward(const Tensor& x) override { return head->forward(bn->forward(x)); }
  std::shared_ptr<nn::Sequential> head;
  std::shared_ptr<nn::BatchNorm1d> bn;
};
}  // namespace

TEST(ConvertSyncBatchnorm, AParentThatCannotFollowIsAnErrorAndTheModelStaysAsItWas) {
  auto model = std::make_shared<MemberModel>();
  const auto head_bn = (*model->head)[0];
  EXPECT_EMBER_ERROR(nn::convert_sync_batchnorm(model), "MemberModel: cannot replace its child 'bn' (BatchNorm1d)");
  EXPECT_EQ((*model->head)[0], head_bn);  // the conversion inside head was undone
  EXPECT_EQ(model->head->named_children()[0].second, head_bn);
  EXPECT_EQ(model->named_children()[1].second, model->bn);
}

// ---- real processes

namespace {

constexpr auto kDeadline = std::chrono::seconds(60);

std::vector<ember::testing::ChildOutcome> run_job(int world, const std::vector<std::string>& args,
                                                  std::chrono::seconds deadline = kDeadline) {
  std::vector<std::string> argv{ember::testing::env_or("EMBER_TEST_PROGRAMS", EMBER_TEST_PROGRAMS) +
                                std::string("/syncbn_worker")};
  argv.insert(argv.end(), args.begin(), args.end());
  const char* tmp = std::getenv("TMPDIR");
  const std::string logs = std::string(tmp ? tmp : "/tmp") + "/syncbn_" + args[0] + "_" +
                           std::to_string(ember::testing::free_port()) + "_rank";
  std::map<std::string, std::optional<std::string>> env{
      {"EMBER_USE_CPU", "1"}, {"EMBER_MIXED_PRECISION", std::nullopt}, {"EMBER_GRADIENT_ACCUMULATION_STEPS", std::nullopt}};
  return ember::testing::run_loopback_job(argv, world, logs, env, deadline);
}

void expect_every_rank(const std::vector<ember::testing::ChildOutcome>& outcomes, const std::string& marker) {
  for (size_t r = 0; r < outcomes.size(); ++r) {
    EXPECT_EQ(outcomes[r].exit_code, 0) << "rank " << r << ":\n" << outcomes[r].output;
    EXPECT_NE(outcomes[r].output.find(marker), std::string::npos) << "rank " << r << ":\n" << outcomes[r].output;
  }
}

}  // namespace

TEST(SyncBatchNormProcesses, TwoRanksWithUnequalBatchesMatchOneProcess) {
  expect_every_rank(run_job(2, {"match", "2", "3", "5"}), "match ok");
}

TEST(SyncBatchNormProcesses, ASingleValuePerChannelOnOneRankIsFineOverTwoRanks) {
  // rank 0 alone could not train ([1, C, 1, 1]: one value per channel); with rank 1 it can
  expect_every_rank(run_job(2, {"match", "1", "1", "3"}), "match ok");
}

TEST(SyncBatchNormProcesses, ThreeRanksOneWithAnEmptyBatchMatchOneProcess) {
  expect_every_rank(run_job(3, {"match", "2", "2", "0", "3"}), "match ok");
}

TEST(SyncBatchNormProcesses, ThreeRanksWithOneSampleEachMatchOneProcess) {
  expect_every_rank(run_job(3, {"match", "1", "1", "1", "1"}), "match ok");
}

TEST(SyncBatchNormProcesses, TwoRanksWithHalvesOfABatchGiveOneProcessSecondOrderGradients) {
  expect_every_rank(run_job(2, {"penalty", "2", "3", "3"}), "penalty ok");
}

TEST(SyncBatchNormProcesses, SecondOrderGradientsWithUnequalBatchesAndAnEmptyRankMatchOneProcess) {
  expect_every_rank(run_job(3, {"penalty", "2", "2", "0", "3"}), "penalty ok");
}

TEST(SyncBatchNormProcesses, AChannelMismatchFailsOnEveryRankWithoutHanging) {
  // the workers' group timeout is longer than this deadline: only a prompt error passes
  const auto outcomes = run_job(2, {"mismatch"}, std::chrono::seconds(30));
  expect_every_rank(outcomes, "mismatch ok");
  for (const auto& o : outcomes) EXPECT_NE(o.output.find("rank 1 has 4 channels (num_features) but rank 0 has 3"),
                                           std::string::npos) << o.output;
}

TEST(SyncBatchNormProcesses, AnAcceleratorPreparedConvertedModelTrainsAsOneProcess) {
  expect_every_rank(run_job(2, {"accel", "5", "4"}), "accel ok");
}
