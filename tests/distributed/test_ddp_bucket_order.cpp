// DistributedDataParallel's bucket layout after the first pass (rebuilt from the real gradient
// order, rank 0 deciding), static_graph and the debug report (docs/ddp_communication.md).
// Threads as ranks (HashStore + ProcessGroupGloo).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "ddp_test_model.h"
#include "nn/layers/basic.h"
#include "test_util.h"
#include "thread_ranks.h"

using namespace ember;
using namespace ember::distributed;
using namespace ember::ddp_test;
using ember::test::expect_no_errors;
using ember::test::run_ranks;

namespace {

constexpr double kBytes = 1.0 / (1024.0 * 1024.0);  // bucket caps below are in bytes

// Three 16x16 layers registered l0, l1, l2 but applied l2, l1, l0: backward finishes l0 first,
// the opposite of the reverse registration order the first layout guesses. `order` overrides
// the application order (a rank whose graph differs); `with_spare` adds a layer the forward
// uses only when `use_spare` is set.
class Reversed : public nn::Module {
 public:
  explicit Reversed(bool with_spare = false) : Module("Reversed") {
    for (int i = 0; i < 3; ++i)
      layers.push_back(register_module("l" + std::to_string(i), std::make_shared<nn::Linear>(16, 16)));
    if (with_spare) spare = register_module("spare", std::make_shared<nn::Linear>(16, 16));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = x;
    for (int i : order) h = tanh(layers[size_t(i)]->forward(h));
    if (use_spare) h = h + spare->forward(x);
    return h;
  }
  std::vector<std::shared_ptr<nn::Linear>> layers;
  std::shared_ptr<nn::Linear> spare;
  std::vector<int> order{2, 1, 0};
  bool use_spare = false;
};

std::shared_ptr<Reversed> make_reversed(uint64_t seed, bool with_spare = false) {
  auto m = std::make_shared<Reversed>(with_spare);
  fill_deterministic(*m, seed);
  return m;
}

// One pass on rows of step `s` (8 rows per rank), then an SGD step.
void train_step(Reversed& m, const ProcessGroup& pg, int s) {
  Tensor x = uniform_tensor(500 + uint64_t(s), {8 * pg.size(), 16}).narrow(0, 8 * pg.rank(), 8).contiguous();
  Tensor y = uniform_tensor(600 + uint64_t(s), {8 * pg.size(), 16}).narrow(0, 8 * pg.rank(), 8).contiguous();
  nn::functional::mse_loss(m.forward(x), y).backward();
  sgd_step(m, 0.1);
}

// The layer ("l0", "l1", ...) of each name, in order.
std::vector<std::string> layers_of(const std::vector<std::string>& names) {
  std::vector<std::string> out;
  for (const auto& n : names) out.push_back(n.substr(0, n.find('.')));
  return out;
}

using Names = std::vector<std::string>;

}  // namespace

TEST(DDPBucketOrder, LayoutFollowsTheFirstPassGradientOrderWithASmallFirstBucket) {
  expect_no_errors(run_ranks(2, [](std::shared_ptr<ProcessGroup> pg) {
    auto model = make_reversed(1);
    // A layer is 1088 bytes: the first bucket holds one layer, the others two.
    DistributedDataParallel ddp(model, pg, {.bucket_cap_mb = 2200 * kBytes, .first_bucket_cap_mb = 1100 * kBytes});
    EXPECT_FALSE(ddp.buckets_rebuilt());
    EXPECT_EQ(layers_of(ddp.bucket_parameter_names()[0]), (Names{"l2", "l2"}));  // the guess
    EXPECT_EQ(ddp.bucket_sizes(), (std::vector<int64_t>{1088, 2176}));
    train_step(*model, *pg, 0);
    ASSERT_TRUE(ddp.buckets_rebuilt());
    const Names order = ddp.gradient_ready_order();
    EXPECT_EQ(layers_of(order), (Names{"l0", "l0", "l1", "l1", "l2", "l2"}));
    const auto buckets = ddp.bucket_parameter_names();
    ASSERT_EQ(buckets.size(), 2u);
    EXPECT_EQ(buckets[0], (Names{order[0], order[1]}));
    EXPECT_EQ(buckets[1], (Names{order[2], order[3], order[4], order[5]}));
    EXPECT_EQ(ddp.bucket_sizes(), (std::vector<int64_t>{1088, 2176}));
    // Rebuilt once: later passes keep the layout.
    train_step(*model, *pg, 1);
    EXPECT_EQ(ddp.bucket_parameter_names(), buckets);
  }));
}

TEST(DDPBucketOrder, TheLayoutDoesNotChangeTheResult) {
  // Two ranks: each element is the same sum of two values in any bucket, so bit for bit.
  std::vector<std::vector<float>> small(2), one(2);
  expect_no_errors(run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
    auto a = make_reversed(2), b = make_reversed(2);
    DistributedDataParallel split(a, pg, {.bucket_cap_mb = 1100 * kBytes, .first_bucket_cap_mb = 64 * kBytes});
    DistributedDataParallel whole(b, pg, {.first_bucket_cap_mb = 25});
    for (int s = 0; s < 3; ++s) {
      train_step(*a, *pg, s);
      train_step(*b, *pg, s);
    }
    EXPECT_GE(split.bucket_sizes().size(), 4u);
    EXPECT_EQ(whole.bucket_sizes().size(), 1u);
    small[size_t(pg->rank())] = flat_parameters(*a);
    one[size_t(pg->rank())] = flat_parameters(*b);
  }));
  EXPECT_EQ(small[0], one[0]);
  EXPECT_EQ(small[0], small[1]);
  EXPECT_NE(small[0], flat_parameters(*make_reversed(2)));  // training moved the weights
}

TEST(DDPBucketOrder, RankZerosOrderWinsWhenRanksDiffer) {
  std::vector<Names> layouts(2);
  std::vector<std::vector<float>> weights(2);
  std::vector<std::string> reports(2);
  expect_no_errors(run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = make_reversed(3);
    if (pg->rank() == 1) model->order = {0, 1, 2};  // its gradients come l2 first
    DistributedDataParallel ddp(model, pg, {.bucket_cap_mb = 1100 * kBytes, .first_bucket_cap_mb = 1100 * kBytes});
    for (int s = 0; s < 3; ++s) train_step(*model, *pg, s);
    Names flat;
    for (const auto& b : ddp.bucket_parameter_names()) flat.insert(flat.end(), b.begin(), b.end());
    layouts[size_t(pg->rank())] = flat;
    weights[size_t(pg->rank())] = flat_parameters(*model);
    reports[size_t(pg->rank())] = ddp.debug_report();
  }));
  EXPECT_EQ(layers_of(layouts[0]), (Names{"l0", "l0", "l1", "l1", "l2", "l2"}));
  EXPECT_EQ(layouts[1], layouts[0]);
  EXPECT_EQ(weights[1], weights[0]);  // averaged gradients: both ranks step alike
  for (const auto& r : reports) EXPECT_NE(r.find("1 rank saw another order; rank 0's is used"), std::string::npos) << r;
}

TEST(DDPBucketOrder, StaticGraphSkipsTheUsageReductionAfterTheFirstPass) {
  std::vector<int64_t> usage(2), plain_usage(2);
  std::vector<std::vector<float>> fixed(2), plain(2);
  expect_no_errors(run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
    auto a = make_reversed(4, /*with_spare=*/true), b = make_reversed(4, true);
    DistributedDataParallel s(a, pg, {.find_unused_parameters = true, .static_graph = true});
    DistributedDataParallel d(b, pg, {.find_unused_parameters = true});
    for (int step = 0; step < 3; ++step) {
      train_step(*a, *pg, step);
      train_step(*b, *pg, step);
    }
    usage[size_t(pg->rank())] = s.comm_stats().usage_reductions;
    plain_usage[size_t(pg->rank())] = d.comm_stats().usage_reductions;
    fixed[size_t(pg->rank())] = flat_parameters(*a);
    plain[size_t(pg->rank())] = flat_parameters(*b);
    EXPECT_FALSE(a->spare->weight.grad().defined());  // no rank used it: left alone
  }));
  EXPECT_EQ(usage, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(plain_usage, (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(fixed[0], plain[0]);
  EXPECT_EQ(fixed[1], plain[1]);
}

TEST(DDPBucketOrder, StaticGraphRefusesAPassThatUsesOtherParameters) {
  auto errors = run_ranks(2, [](std::shared_ptr<ProcessGroup> pg) {
    auto model = make_reversed(5, /*with_spare=*/true);
    DistributedDataParallel ddp(model, pg, {.find_unused_parameters = true, .static_graph = true});
    train_step(*model, *pg, 0);
    if (pg->rank() == 1) model->use_spare = true;
    train_step(*model, *pg, 1);
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_NE(errors[1].find("static_graph"), std::string::npos) << errors[1];
  EXPECT_NE(errors[1].find("rank 1"), std::string::npos) << errors[1];
  EXPECT_NE(errors[1].find("'spare."), std::string::npos) << errors[1];
}

TEST(DDPBucketOrder, DebugReportShowsOrderLayoutAndHiddenFraction) {
  ::setenv("EMBER_DISTRIBUTED_DEBUG", "DETAIL", 1);
  ::testing::internal::CaptureStderr();
  std::vector<std::string> reports(2);
  std::vector<CommStats> stats(2);
  auto errors = run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = make_reversed(6);
    DistributedDataParallel ddp(model, pg, {.bucket_cap_mb = 2200 * kBytes, .first_bucket_cap_mb = 1100 * kBytes});
    for (int s = 0; s < 2; ++s) train_step(*model, *pg, s);
    reports[size_t(pg->rank())] = ddp.debug_report();
    stats[size_t(pg->rank())] = ddp.comm_stats();
  });
  const std::string printed = ::testing::internal::GetCapturedStderr();
  ::unsetenv("EMBER_DISTRIBUTED_DEBUG");
  expect_no_errors(errors);
  const std::string& r = reports[0];
  EXPECT_NE(r.find("DistributedDataParallel rank 0 of 2: 6 parameters, 2 buckets (rebuilt"), std::string::npos) << r;
  EXPECT_NE(r.find("gradient-ready order (first pass, rank 0): l0."), std::string::npos) << r;
  EXPECT_NE(r.find("bucket 1: 2.1 KB, 4 parameters: l1."), std::string::npos) << r;
  char hidden[64];
  std::snprintf(hidden, sizeof hidden, "hidden %.0f%%", 100.0 * stats[0].hidden_fraction());
  EXPECT_NE(r.find("total over 2 steps"), std::string::npos) << r;
  EXPECT_NE(r.find(hidden), std::string::npos) << r;
  EXPECT_GE(stats[0].hidden_fraction(), 0.0);
  EXPECT_LE(stats[0].hidden_fraction(), 1.0);
  // INFO's layout once per rank, DETAIL's line per pass and rank.
  EXPECT_NE(printed.find("gradient-ready order (first pass, rank 0)"), std::string::npos) << printed;
  EXPECT_NE(printed.find("DistributedDataParallel rank 1 step 2: communication"), std::string::npos) << printed;

  ::setenv("EMBER_DISTRIBUTED_DEBUG", "LOUD", 1);
  auto bad = run_ranks(1, [](std::shared_ptr<ProcessGroup> pg) { DistributedDataParallel ddp(make_reversed(7), pg); });
  ::unsetenv("EMBER_DISTRIBUTED_DEBUG");
  EXPECT_NE(bad[0].find("EMBER_DISTRIBUTED_DEBUG='LOUD'"), std::string::npos) << bad[0];
}
