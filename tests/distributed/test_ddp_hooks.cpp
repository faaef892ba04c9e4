// DistributedDataParallel removes the hooks it installs: wrapping one model over and over
// leaves nothing behind on its parameters, and training afterwards is plain local training.
#include <chrono>
#include <memory>
#include <vector>

#include "ddp_test_model.h"
#include "distributed/hash_store.h"
#include "distributed/process_group_gloo.h"
#include "test_util.h"

using namespace ember;
using namespace ember::distributed;
using namespace ember::ddp_test;

namespace {

std::shared_ptr<ProcessGroup> single_rank_group() {
  const auto timeout = std::chrono::seconds(20);
  ProcessGroupOptions opt;
  opt.timeout = timeout;
  return std::make_shared<ProcessGroupGloo>(std::make_shared<HashStore>(timeout), 0, 1, opt);
}

std::vector<size_t> hook_counts(const nn::Module& m) {
  std::vector<size_t> counts;
  for (const Tensor& p : m.parameters()) counts.push_back(p.hook_count());
  return counts;
}

std::vector<float> grads_after_one_step(const std::shared_ptr<Mlp>& model) {
  model->zero_grad();
  auto [x, y] = batch_rows(3, 8, 0, 8);
  nn::functional::mse_loss(model->forward(x), y).backward();
  std::vector<float> out;
  for (const Tensor& p : model->parameters()) {
    auto g = p.grad().to_vector<float>();
    out.insert(out.end(), g.begin(), g.end());
  }
  return out;
}

}  // namespace

TEST(DDPHooks, OneHookPerParameterWhileAliveNoneAfter) {
  auto pg = single_rank_group();
  auto model = make_mlp(7);
  const size_t n = model->parameters().size();
  {
    DistributedDataParallel ddp(model, pg, {.bucket_cap_mb = kSmallBucketMb});
    EXPECT_EQ(hook_counts(*model), std::vector<size_t>(n, 1));
    {
      DistributedDataParallel second(model, pg);
      EXPECT_EQ(hook_counts(*model), std::vector<size_t>(n, 2));
    }
    EXPECT_EQ(hook_counts(*model), std::vector<size_t>(n, 1));
  }
  EXPECT_EQ(hook_counts(*model), std::vector<size_t>(n, 0));
}

TEST(DDPHooks, AHundredWrappersLeaveNoHooksAndPlainGradients) {
  auto pg = single_rank_group();
  auto reference = make_mlp(11);
  const std::vector<float> want = grads_after_one_step(reference);

  auto model = make_mlp(11);
  for (int i = 0; i < 100; ++i) {
    DistributedDataParallel ddp(model, pg, {.bucket_cap_mb = kSmallBucketMb, .gradient_as_bucket_view = i % 2 == 1});
    if (i == 99) {
      // A wrapper that is alive still reduces (over one rank: the same gradients).
      EXPECT_EQ(grads_after_one_step(model), want);
      EXPECT_EQ(ddp.comm_stats().steps, 1);
    }
  }
  EXPECT_EQ(hook_counts(*model), std::vector<size_t>(model->parameters().size(), 0));
  EXPECT_EQ(grads_after_one_step(model), want);
  EXPECT_EQ(grads_after_one_step(model), want);
}
