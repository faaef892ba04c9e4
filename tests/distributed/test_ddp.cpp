// DistributedDataParallel: threads as ranks (HashStore + ProcessGroupGloo) and real processes
// (ddp_worker over a TcpStore). N ranks at batch b must reach the parameters one rank reaches
// at batch N*b.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <mutex>
#include <thread>

#include "ddp_test_model.h"
#include "distributed/hash_store.h"
#include "distributed/process_group_gloo.h"
#include "process_test_util.h"
#include "test_util.h"
#include "thread_ranks.h"

using namespace ember;
using namespace ember::distributed;
using namespace ember::ddp_test;
using ember::test::expect_no_errors;
using ember::test::run_ranks;

namespace {

std::vector<float> flat_grads(const nn::Module& m) {
  std::vector<float> out;
  for (auto& p : m.parameters()) {
    if (!p.grad().defined()) continue;
    auto g = p.grad().to_vector<float>();
    out.insert(out.end(), g.begin(), g.end());
  }
  return out;
}

}  // namespace

TEST(DDP, BucketsFollowReverseRegistrationOrderAndCap) {
  expect_no_errors(run_ranks(1, [](std::shared_ptr<ProcessGroup> pg) {
    auto model = make_mlp(1);
    DistributedDataParallel ddp(model, pg, {.bucket_cap_mb = kSmallBucketMb});
    // fc3.* and fc2.bias fit in 1000 bytes; fc2.weight (1024 bytes) gets a bucket of its own.
    using Names = std::vector<std::string>;
    EXPECT_EQ(ddp.bucket_parameter_names(),
              (std::vector<Names>{{"fc3.bias", "fc3.weight", "fc2.bias"}, {"fc2.weight"}, {"fc1.bias", "fc1.weight"}}));
    EXPECT_EQ(ddp.bucket_sizes(), (std::vector<int64_t>{4 * (3 + 48 + 16), 4 * 256, 4 * (16 + 96)}));
    EXPECT_EQ(ddp.module(), model);
    EXPECT_EQ(ddp.process_group(), pg);

    // The default 25 MB cap holds the whole model in one bucket.
    auto other = make_mlp(2);
    DistributedDataParallel one(other, pg);
    EXPECT_EQ(one.bucket_sizes().size(), 1u);

    // Parameters of different dtypes never share a bucket.
    auto mixed = make_mlp(3);
    mixed->fc2->to(DType::f64);
    DistributedDataParallel split(mixed, pg);
    using Names = std::vector<std::string>;
    EXPECT_EQ(split.bucket_parameter_names(),
              (std::vector<Names>{{"fc3.bias", "fc3.weight", "fc1.bias", "fc1.weight"}, {"fc2.bias", "fc2.weight"}}));
    EXPECT_EMBER_ERROR(DistributedDataParallel(make_mlp(4), pg, {.bucket_cap_mb = 0}), "bucket_cap_mb");
  }));
}

TEST(DDP, TwoRanksMatchOneRankOnTheConcatenatedBatch) {
  TrainPlan plan;  // 5 SGD steps, 4 rows per rank
  auto reference = make_mlp(11);
  train_reference(*reference, plan, 2);
  std::vector<double> diffs(2, -1);
  std::vector<CommStats> stats(2);
  expect_no_errors(run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = make_mlp(11);
    DistributedDataParallel ddp(model, pg, {.bucket_cap_mb = kSmallBucketMb});
    ASSERT_EQ(ddp.bucket_sizes().size(), 3u);
    train_ddp(ddp, plan);
    diffs[size_t(pg->rank())] = max_abs_diff(*model, *reference);
    stats[size_t(pg->rank())] = ddp.comm_stats();
  }));
  for (int r = 0; r < 2; ++r) {
    EXPECT_LE(diffs[size_t(r)], 1e-5) << "rank " << r;
    EXPECT_GE(diffs[size_t(r)], 0) << "rank " << r;
    EXPECT_EQ(stats[size_t(r)].steps, plan.steps);
    EXPECT_EQ(stats[size_t(r)].buckets_reduced, 3 * plan.steps);
    EXPECT_EQ(stats[size_t(r)].bytes_reduced, plan.steps * 4 * reference->num_parameters());
    EXPECT_GE(stats[size_t(r)].total_comm_ms, stats[size_t(r)].total_exposed_ms);
    EXPECT_GE(stats[size_t(r)].total_exposed_ms, 0);
  }
  // Training really moved the parameters (the comparison is not trivially satisfied).
  EXPECT_GT(max_abs_diff(*reference, *make_mlp(11)), 1e-3);
}

TEST(DDP, GradientsAsBucketViewsGiveTheSameTraining) {
  TrainPlan plan;
  auto reference = make_mlp(12);
  train_reference(*reference, plan, 2);
  std::vector<double> diffs(2, -1);
  expect_no_errors(run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = make_mlp(12);
    DistributedDataParallel ddp(model, pg, {.bucket_cap_mb = kSmallBucketMb, .gradient_as_bucket_view = true});
    // Keep the gradients between steps (zeroed in place) so they stay bucket views.
    for (int s = 0; s < plan.steps; ++s) {
      auto [x, y] = batch_rows(s, 2 * plan.per_rank_batch, plan.per_rank_batch * pg->rank(), plan.per_rank_batch);
      nn::functional::mse_loss(ddp.forward(x), y).backward();
      NoGradGuard ng;
      for (auto& p : model->parameters()) p.add_(p.grad(), -plan.lr);
      model->zero_grad(/*set_to_none=*/false);
    }
    // The gradients moved into the rebuilt layout: fc3's weight, then its bias (the order
    // backward produces them), side by side in the first bucket.
    ASSERT_TRUE(ddp.buckets_rebuilt());
    ASSERT_EQ(ddp.bucket_parameter_names()[0][0], "fc3.weight");
    ASSERT_EQ(ddp.bucket_parameter_names()[0][1], "fc3.bias");
    Tensor gb = model->fc3->bias.grad(), gw = model->fc3->weight.grad();
    EXPECT_EQ(static_cast<char*>(gb.raw_data()) - static_cast<char*>(gw.raw_data()), 48 * 4);
    diffs[size_t(pg->rank())] = max_abs_diff(*model, *reference);
  }));
  for (int r = 0; r < 2; ++r) EXPECT_LE(diffs[size_t(r)], 1e-5) << "rank " << r;
  EXPECT_GE(diffs[0], 0);
}

TEST(DDP, NoSyncAccumulatesLocallyThenReducesEverything) {
  TrainPlan plan;
  plan.micro_batches = 3;
  plan.steps = 3;
  auto reference = make_mlp(21);
  train_reference(*reference, plan, 2);
  std::vector<double> diffs(2, -1);
  expect_no_errors(run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = make_mlp(21);
    DistributedDataParallel ddp(model, pg, {.bucket_cap_mb = kSmallBucketMb});
    train_ddp(ddp, plan);
    // Only the last micro-batch of each step communicated.
    EXPECT_EQ(ddp.comm_stats().steps, plan.steps);
    EXPECT_EQ(ddp.comm_stats().buckets_reduced, 3 * plan.steps);
    diffs[size_t(pg->rank())] = max_abs_diff(*model, *reference);

    // Inside no_sync the gradients stay local: the ranks see different data, so they differ.
    auto [x, y] = batch_rows(99, 8, 4 * pg->rank(), 4);
    {
      auto guard = ddp.no_sync();
      EXPECT_FALSE(ddp.require_backward_grad_sync());
      nn::functional::mse_loss(ddp.forward(x), y).backward();
    }
    EXPECT_TRUE(ddp.require_backward_grad_sync());
    auto local = from_vector<float>(flat_grads(*model));
    auto all = pg->allgather(local);
    EXPECT_GT((all[0] - all[1]).abs().max().item<double>(), 1e-4);
  }));
  for (int r = 0; r < 2; ++r) EXPECT_LE(diffs[size_t(r)], 1e-5) << "rank " << r;
  EXPECT_GE(diffs[1], 0);
}

TEST(DDP, ConstructionBroadcastsRankZerosParametersAndBuffers) {
  std::vector<std::vector<float>> after(2), rank0_before(1);
  std::vector<std::vector<float>> buffers(2);
  std::mutex mu;
  expect_no_errors(run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
    const int r = pg->rank();
    auto model = make_mlp(100 + uint64_t(r), false, /*with_buffer=*/true);  // different on each rank
    if (r == 0) {
      std::lock_guard<std::mutex> lock(mu);
      for (auto& p : model->parameters()) {
        auto v = p.to_vector<float>();
        rank0_before[0].insert(rank0_before[0].end(), v.begin(), v.end());
      }
    }
    DistributedDataParallel ddp(model, pg);
    for (auto& p : model->parameters()) {
      auto v = p.to_vector<float>();
      after[size_t(r)].insert(after[size_t(r)].end(), v.begin(), v.end());
    }
    // Buffers drift apart (e.g. running statistics); sync_buffers brings back rank 0's.
    Tensor buf = model->named_buffers().at(0).second;
    {
      NoGradGuard ng;
      buf.fill_(double(r + 5));
    }
    ddp.sync_buffers();
    buffers[size_t(r)] = buf.to_vector<float>();
  }));
  ASSERT_FALSE(rank0_before[0].empty());
  EXPECT_EQ(after[0], rank0_before[0]);
  EXPECT_EQ(after[1], rank0_before[0]);
  EXPECT_EQ(buffers[1], std::vector<float>(size_t(kHidden), 5.0f));
  EXPECT_EQ(buffers[0], buffers[1]);
}

TEST(DDP, BroadcastBuffersOffLeavesBuffersAlone) {
  std::vector<float> rank1;
  expect_no_errors(run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = make_mlp(5, false, true);
    DistributedDataParallel ddp(model, pg, {.broadcast_buffers = false});
    Tensor buf = model->named_buffers().at(0).second;
    {
      NoGradGuard ng;
      buf.fill_(double(pg->rank()));
    }
    ddp.sync_buffers();
    if (pg->rank() == 1) rank1 = buf.to_vector<float>();
  }));
  EXPECT_EQ(rank1, std::vector<float>(size_t(kHidden), 1.0f));
}

TEST(DDP, DifferentModelsOnRanksAreAnErrorOnEveryRank) {
  auto errors = run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = pg->rank() == 0 ? std::make_shared<Mlp>(kIn, 8, kOut) : std::make_shared<Mlp>(kIn, 9, kOut);
    DistributedDataParallel ddp(model, pg);
  });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("DistributedDataParallel: parameter 'fc1.weight' has shape [8, 6] on rank 0 but [9, 6] on rank 1"),
              std::string::npos)
        << e;
  }
  errors = run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = std::make_shared<Mlp>(kIn, kHidden, kOut, /*with_extra=*/pg->rank() == 1);
    DistributedDataParallel ddp(model, pg);
  });
  for (const auto& e : errors) EXPECT_NE(e.find("'extra.weight' exists on rank 1 but not on rank 0"), std::string::npos) << e;
  errors = run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = std::make_shared<Mlp>(kIn, kHidden, kOut);
    if (pg->rank() == 1) model->fc3->to(DType::f64);
    DistributedDataParallel ddp(model, pg);
  });
  for (const auto& e : errors) EXPECT_NE(e.find("'fc3.weight' has dtype float32 on rank 0 but float64 on rank 1"), std::string::npos) << e;
}

TEST(DDP, UnusedParametersAreAnErrorNamingThem) {
  std::vector<int> survived(2, 0);
  auto errors = run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = make_mlp(31, /*with_extra=*/true);
    DistributedDataParallel ddp(model, pg, {.bucket_cap_mb = kSmallBucketMb});
    auto [x, y] = batch_rows(0, 8, 4 * pg->rank(), 4);
    EXPECT_EMBER_ERROR(nn::functional::mse_loss(ddp.forward(x), y).backward(), "DistributedDataParallel",
                       "2 parameters received no gradient", "'extra.weight', 'extra.bias'", "find_unused_parameters");
    // The failed pass is forgotten: once the branch is used, training proceeds.
    model->zero_grad();
    model->use_extra = true;
    nn::functional::mse_loss(ddp.forward(x), y).backward();
    EXPECT_TRUE(model->extra->weight.grad().defined());
    survived[size_t(pg->rank())] = 1;
  });
  expect_no_errors(errors);
  EXPECT_EQ(survived, (std::vector<int>{1, 1}));
}

TEST(DDP, FindUnusedParametersTreatsMissingGradientsAsZero) {
  // Rank 1 uses the extra branch, rank 0 does not: the reference is the mean of both losses.
  auto reference = make_mlp(41, true);
  {
    auto [x0, y0] = batch_rows(0, 8, 0, 4);
    auto [x1, y1] = batch_rows(0, 8, 4, 4);
    Tensor l0 = nn::functional::mse_loss(reference->forward(x0), y0);
    reference->use_extra = true;
    Tensor l1 = nn::functional::mse_loss(reference->forward(x1), y1);
    ((l0 + l1) * 0.5).backward();
  }
  auto want = flat_grads(*reference);
  std::vector<std::vector<float>> got(2);
  std::vector<int> unused_grad_defined(2, -1);
  expect_no_errors(run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = make_mlp(41, true);
    DistributedDataParallel ddp(model, pg, {.bucket_cap_mb = kSmallBucketMb, .find_unused_parameters = true});
    model->use_extra = pg->rank() == 1;
    auto [x, y] = batch_rows(0, 8, 4 * pg->rank(), 4);
    nn::functional::mse_loss(ddp.forward(x), y).backward();
    got[size_t(pg->rank())] = flat_grads(*model);

    // No rank uses the branch: its gradients stay undefined, as in a single process.
    model->zero_grad();
    model->use_extra = false;
    nn::functional::mse_loss(ddp.forward(x), y).backward();
    unused_grad_defined[size_t(pg->rank())] = model->extra->weight.grad().defined() ? 1 : 0;
    EXPECT_TRUE(model->fc1->weight.grad().defined());
  }));
  ASSERT_EQ(want.size(), got[0].size());
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(got[size_t(r)].size(), want.size());
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, double(std::abs(got[size_t(r)][i] - want[i])));
    EXPECT_LE(worst, 1e-6) << "rank " << r;
  }
  EXPECT_EQ(unused_grad_defined, (std::vector<int>{0, 0}));
}

TEST(DDP, DestroyingItRemovesItsEffect) {
  std::vector<std::vector<float>> grads(2);
  expect_no_errors(run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = make_mlp(51);
    {
      DistributedDataParallel ddp(model, pg);
    }
    auto [x, y] = batch_rows(0, 8, 4 * pg->rank(), 4);
    nn::functional::mse_loss(model->forward(x), y).backward();
    grads[size_t(pg->rank())] = flat_grads(*model);
  }));
  // Purely local gradients: each rank saw other rows.
  ASSERT_EQ(grads[0].size(), grads[1].size());
  EXPECT_NE(grads[0], grads[1]);
}

TEST(DDP, BackwardOutsideTheModelAndSecondBackwardInOneStep) {
  // Two backward passes before one step: each averages its own contribution, and the sum is
  // the average of the sums (as in PyTorch).
  auto reference = make_mlp(61);
  for (int pass = 0; pass < 2; ++pass) {
    auto [x, y] = batch_rows(pass, 8, 0, 8);
    nn::functional::mse_loss(reference->forward(x), y).backward();
  }
  auto want = flat_grads(*reference);
  std::vector<std::vector<float>> got(2);
  expect_no_errors(run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = make_mlp(61);
    DistributedDataParallel ddp(model, pg, {.bucket_cap_mb = kSmallBucketMb});
    // A backward that touches none of the model's parameters does not involve DDP.
    Tensor z = from_vector<float>({1, 2}).requires_grad_();
    sum(z * z).backward();
    for (int pass = 0; pass < 2; ++pass) {
      auto [x, y] = batch_rows(pass, 8, 4 * pg->rank(), 4);
      nn::functional::mse_loss(ddp.forward(x), y).backward();
    }
    got[size_t(pg->rank())] = flat_grads(*model);
  }));
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(got[size_t(r)].size(), want.size());
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, double(std::abs(got[size_t(r)][i] - want[i])));
    EXPECT_LE(worst, 1e-6) << "rank " << r;
  }
}

TEST(DDP, APassThatFailsMidwayIsDrainedAndForgotten) {
  auto reference = make_mlp(71);
  {
    auto [x, y] = batch_rows(1, 8, 0, 8);
    nn::functional::mse_loss(reference->forward(x), y).backward();
  }
  auto want = flat_grads(*reference);
  std::vector<std::vector<float>> got(2);
  expect_no_errors(run_ranks(2, [&](std::shared_ptr<ProcessGroup> pg) {
    auto model = make_mlp(71);
    DistributedDataParallel ddp(model, pg, {.bucket_cap_mb = kSmallBucketMb});
    // A hook after DDP's fails once, when the earlier buckets are already on the wire.
    bool fail = true;
    model->fc1->weight.register_post_accumulate_grad_hook([&](const Tensor&) {
      if (fail) EMBER_FAIL("user hook failed on purpose");
    });
    auto [x0, y0] = batch_rows(0, 8, 4 * pg->rank(), 4);
    EXPECT_EMBER_ERROR(nn::functional::mse_loss(ddp.forward(x0), y0).backward(), "user hook failed on purpose");
    EXPECT_GE(ddp.comm_stats().buckets_reduced, 2);
    EXPECT_EQ(ddp.comm_stats().steps, 0);
    fail = false;
    model->zero_grad();
    auto [x, y] = batch_rows(1, 8, 4 * pg->rank(), 4);
    nn::functional::mse_loss(ddp.forward(x), y).backward();
    EXPECT_EQ(ddp.comm_stats().steps, 1);
    got[size_t(pg->rank())] = flat_grads(*model);
  }));
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(got[size_t(r)].size(), want.size());
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, double(std::abs(got[size_t(r)][i] - want[i])));
    EXPECT_LE(worst, 1e-6) << "rank " << r;
  }
}

// ---- real processes

namespace {

std::vector<ember::testing::RankProcess> run_workers(int world, const std::string& mode, std::chrono::seconds deadline) {
  return ember::testing::run_rank_processes("ddp_worker", mode, world, deadline);
}

}  // namespace

TEST(DDPProcesses, TwoProcessesMatchOneProcessOnTheConcatenatedBatch) {
  auto children = run_workers(2, "train", std::chrono::seconds(60));
  for (size_t r = 0; r < children.size(); ++r) {
    const std::string log = children[r].take_log();
    EXPECT_TRUE(children[r].exited_ok()) << "rank " << r << " " << children[r].log << ":\n" << log;
    EXPECT_NE(log.find("equivalence ok"), std::string::npos) << log;
    EXPECT_NE(log.find("no_sync ok"), std::string::npos) << log;
    EXPECT_NE(log.find("bf16 comm hook ok"), std::string::npos) << log;
  }
}

TEST(DDPProcesses, RowSparseWordEmbeddingsTrainBertMiniAsTheDenseTableDoes) {
  // A hang guard, not a timing: each rank trains BERT-mini twice, 70-80 s under ThreadSanitizer.
  auto children = run_workers(2, "sparse", std::chrono::seconds(300));
  for (size_t r = 0; r < children.size(); ++r) {
    const std::string log = children[r].take_log();
    EXPECT_TRUE(children[r].exited_ok()) << "rank " << r << " " << children[r].log << ":\n" << log;
    EXPECT_NE(log.find("sparse embeddings ok"), std::string::npos) << log;
  }
}

TEST(DDPProcesses, ShapeMismatchIsReportedByEveryProcess) {
  auto children = run_workers(2, "mismatch", std::chrono::seconds(60));
  for (size_t r = 0; r < children.size(); ++r) {
    const std::string log = children[r].take_log();
    EXPECT_TRUE(children[r].exited_ok()) << "rank " << r << ":\n" << log;
    EXPECT_NE(log.find("parameter 'fc1.weight' has shape [16, 6] on rank 0 but [17, 6] on rank 1"), std::string::npos)
        << log;
  }
}
