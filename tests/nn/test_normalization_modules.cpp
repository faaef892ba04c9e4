// BatchNorm1d, BatchNorm2d, GroupNorm and RMSNorm: parameter and buffer names and shapes (as
// PyTorch's state dicts), training against evaluation, the running statistics over several
// steps against a computation from the reference, the cumulative average of momentum=nullopt,
// and errors.
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "kernels/reference/normalization.h"
#include "nn/layers/normalization.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::random_tensor;
using reference::RefTensor;

namespace {

std::vector<std::string> names_of(const std::vector<std::pair<std::string, Tensor>>& named) {
  std::vector<std::string> out;
  for (const auto& [name, t] : named) out.push_back(name);
  return out;
}

// The running statistics after the given training batches, from the reference batch norm
// applied step by step; momentum nullopt is the cumulative average (the k-th batch weighs 1/k).
std::pair<RefTensor, RefTensor> reference_running_stats(const std::vector<Tensor>& batches, int64_t c,
                                                        std::optional<double> momentum, double eps) {
  RefTensor rm({c}, 0.0), rv({c}, 1.0);
  for (size_t k = 0; k < batches.size(); ++k) {
    const double m = momentum ? *momentum : 1.0 / double(k + 1);
    const auto r = reference::batch_norm(reference::from_tensor(batches[k]), &rm, &rv, nullptr, nullptr, true, m, eps);
    rm = r.running_mean;
    rv = r.running_var;
  }
  return {rm, rv};
}

}  // namespace

TEST(BatchNormModule, ParametersAndBuffersAreNamedAsPyTorch) {
  nn::BatchNorm2d bn(5);
  EXPECT_EQ(names_of(bn.named_parameters()), (std::vector<std::string>{"weight", "bias"}));
  EXPECT_EQ(names_of(bn.named_buffers()),
            (std::vector<std::string>{"running_mean", "running_var", "num_batches_tracked"}));
  const nn::StateDict sd = bn.state_dict();
  ASSERT_EQ(sd.size(), 5u);
  EXPECT_EQ(sd.at("weight").shape(), (Shape{5}));
  EXPECT_EQ(sd.at("bias").shape(), (Shape{5}));
  EXPECT_EQ(sd.at("running_mean").shape(), (Shape{5}));
  EXPECT_TRUE(all_close(sd.at("running_var"), ones({5}), 0, 0));
  EXPECT_TRUE(all_close(sd.at("running_mean"), zeros({5}), 0, 0));
  EXPECT_EQ(sd.at("num_batches_tracked").shape(), (Shape{}));
  EXPECT_EQ(sd.at("num_batches_tracked").dtype(), DType::i64);

  nn::BatchNorm1d plain(3, {.affine = false, .track_running_stats = false});
  EXPECT_TRUE(plain.named_parameters().empty());
  EXPECT_TRUE(plain.named_buffers().empty());
  EXPECT_TRUE(plain.state_dict().empty());
}

TEST(BatchNormModule, RunningStatsAfterThreeStepsMatchTheReference) {
  for (std::optional<double> momentum : {std::optional<double>(0.1), std::optional<double>(0.3), std::optional<double>()}) {
    SCOPED_TRACE(momentum ? "momentum " + std::to_string(*momentum) : std::string("cumulative average"));
    nn::BatchNorm2d bn(3, {.momentum = momentum});
    std::vector<Tensor> batches;
    for (int step = 0; step < 3; ++step) {
      // each batch with its own offset and scale, so a wrong weighting of the steps shows
      batches.push_back(add(mul(random_tensor({4, 3, 2, 5}), 1.0 + step), 0.5 * step));
      bn.forward(batches.back());
    }
    EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 3);
    const auto [rm, rv] = reference_running_stats(batches, 3, momentum, 1e-5);
    EXPECT_TRUE(all_close(bn.running_mean, rm, 1e-5, 1e-6));
    EXPECT_TRUE(all_close(bn.running_var, rv, 1e-5, 1e-6));
  }
}

TEST(BatchNormModule, TrainingUsesBatchStatisticsAndEvalTheRunningOnes) {
  nn::BatchNorm1d bn(4);
  bn.weight.detach().copy_(random_tensor({4}));
  bn.bias.detach().copy_(random_tensor({4}));
  Tensor x = random_tensor({6, 4, 3}, DType::f32, false, -1.0, 3.0);
  const RefTensor rx = reference::from_tensor(x), rw = reference::from_tensor(bn.weight.detach());
  const RefTensor rb = reference::from_tensor(bn.bias.detach());
  Tensor y_train = bn.forward(x);
  EXPECT_TRUE(all_close(y_train, reference::batch_norm(rx, nullptr, nullptr, &rw, &rb, true, 0.1, 1e-5).y, 1e-5, 4e-5));

  bn.eval();
  const Tensor rm = bn.running_mean.clone(), rv = bn.running_var.clone();
  Tensor y_eval = bn.forward(x);
  const RefTensor rrm = reference::from_tensor(rm), rrv = reference::from_tensor(rv);
  EXPECT_TRUE(all_close(y_eval, reference::batch_norm(rx, &rrm, &rrv, &rw, &rb, false, 0.1, 1e-5).y, 1e-5, 4e-5));
  EXPECT_FALSE(all_close(y_eval, y_train, 1e-3, 1e-3));  // one step has not reached the batch statistics
  EXPECT_TRUE(all_close(bn.running_mean, rm, 0, 0));     // evaluation leaves them alone
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 1);
  // a single sample is fine in evaluation
  EXPECT_EQ(bn.forward(random_tensor({1, 4})).shape(), (Shape{1, 4}));

  // without running statistics, evaluation normalises with the batch's own
  nn::BatchNorm1d untracked(4, {.track_running_stats = false});
  untracked.eval();
  EXPECT_TRUE(all_close(untracked.forward(x), reference::batch_norm(rx, nullptr, nullptr, nullptr, nullptr, true,
                                                                    0.1, 1e-5).y,
                        1e-5, 4e-5));
}

TEST(BatchNormModule, GradientsReachTheParameters) {
  nn::BatchNorm2d bn(2);
  Tensor x = random_tensor({3, 2, 2, 2}).requires_grad_();
  bn.forward(x).pow(2.0).sum().backward();
  ASSERT_TRUE(bn.weight.grad().defined());
  ASSERT_TRUE(bn.bias.grad().defined());
  ASSERT_TRUE(x.grad().defined());
  EXPECT_FALSE(bn.running_mean.requires_grad());
}

TEST(BatchNormModule, LoadsAStateDict) {
  nn::BatchNorm2d a(3), b(3);
  a.forward(random_tensor({4, 3, 2, 2}));
  b.load_state_dict(a.state_dict());
  EXPECT_TRUE(all_close(b.running_mean, a.running_mean, 0, 0));
  EXPECT_TRUE(all_close(b.running_var, a.running_var, 0, 0));
  EXPECT_EQ(b.num_batches_tracked.item<int64_t>(), 1);
}

TEST(BatchNormModule, Errors) {
  nn::BatchNorm1d bn1(3);
  EXPECT_EMBER_ERROR(bn1.forward(zeros({2, 3, 4, 5})), "BatchNorm1d", "expected 2D or 3D input", "4D");
  EXPECT_EMBER_ERROR(bn1.forward(zeros({3})), "BatchNorm1d", "expected 2D or 3D input", "1D");
  nn::BatchNorm2d bn2(3);
  EXPECT_EMBER_ERROR(bn2.forward(zeros({2, 3, 4})), "BatchNorm2d", "expected 4D input", "3D");
  EXPECT_EMBER_ERROR(bn2.forward(zeros({2, 4, 5, 5})), "batch_norm", "4 channels");
  EXPECT_EMBER_ERROR(bn2.forward(zeros({1, 3, 1, 1})), "more than 1 value per channel");
  EXPECT_EMBER_ERROR(nn::BatchNorm1d(0), "BatchNorm1d", "num_features");
  EXPECT_EMBER_ERROR(nn::BatchNorm1d(3, {.momentum = 1.5}), "BatchNorm1d", "momentum");
}

TEST(GroupNormModule, ParametersForwardAndErrors) {
  nn::GroupNorm gn(2, 6);
  EXPECT_EQ(names_of(gn.named_parameters()), (std::vector<std::string>{"weight", "bias"}));
  EXPECT_EQ(gn.weight.shape(), (Shape{6}));
  EXPECT_TRUE(gn.named_buffers().empty());
  gn.weight.detach().copy_(random_tensor({6}));
  Tensor x = random_tensor({3, 6, 4});
  const RefTensor rw = reference::from_tensor(gn.weight.detach()), rb = reference::from_tensor(gn.bias.detach());
  EXPECT_TRUE(all_close(gn.forward(x), reference::group_norm(reference::from_tensor(x), 2, &rw, &rb, 1e-5), 1e-5,
                        4e-5));
  gn.eval();  // no running statistics: evaluation computes the same
  EXPECT_TRUE(all_close(gn.forward(x), reference::group_norm(reference::from_tensor(x), 2, &rw, &rb, 1e-5), 1e-5,
                        4e-5));
  EXPECT_TRUE(nn::GroupNorm(3, 6, 1e-5, false).named_parameters().empty());
  EXPECT_EMBER_ERROR(nn::GroupNorm(4, 6), "GroupNorm", "num_channels 6", "divisible by num_groups 4");
}

TEST(RMSNormModule, ParametersAndForward) {
  nn::RMSNorm norm({4, 8});
  EXPECT_EQ(names_of(norm.named_parameters()), (std::vector<std::string>{"weight"}));
  EXPECT_EQ(norm.weight.shape(), (Shape{4, 8}));
  norm.weight.detach().copy_(random_tensor({4, 8}));
  Tensor x = random_tensor({2, 4, 8});
  const RefTensor rw = reference::from_tensor(norm.weight.detach());
  const double eps = std::numeric_limits<float>::epsilon();
  EXPECT_TRUE(all_close(norm.forward(x), reference::rms_norm(reference::from_tensor(x), 2, &rw, eps), 1e-5, 4e-5));
  nn::RMSNorm plain({8}, 1e-3, false);
  EXPECT_TRUE(plain.named_parameters().empty());
  EXPECT_TRUE(all_close(plain.forward(x), reference::rms_norm(reference::from_tensor(x), 1, nullptr, 1e-3), 1e-5,
                        4e-5));
  EXPECT_EMBER_ERROR(plain.forward(zeros({2, 4})), "rms_norm", "normalized_shape [8]");
}
