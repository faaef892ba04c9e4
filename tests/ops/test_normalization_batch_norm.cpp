// batch_norm: forward in training and evaluation against the double reference (running
// statistics included) over random [N, C, *] shapes, layouts and dtypes; the backward kernels
// against the reference gradients; gradcheck in f64; the pieces a synchronised batch norm is
// made of, composed over a batch split in two as two ranks would see it; errors.
#include <algorithm>
#include <cmath>
#include <string>

#include "core/autocast.h"
#include "core/native/normalization.h"
#include "kernels/reference/normalization.h"
#include "normalization_test_util.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::coin;
using ember::testing::kFloatTypes;
using ember::testing::random_tensor;
using ember::testing::tolerance;
using ember::testing::uniform_int;
using ember::testing::norm::channel_conditioning;
using ember::testing::norm::grad_tolerance;
using ember::testing::norm::random_channel_shape;
using reference::RefTensor;

namespace {

constexpr double kEps = 1e-5;

struct BatchNormSetup {
  Tensor x, w, b, running_mean, running_var;
  RefTensor rx, rw, rb, rrm, rrv;
};

// x of `shape` in dt; weight, bias and running statistics (f32) each present or not.
BatchNormSetup make_setup(const Shape& shape, DType dt, bool non_contiguous, bool affine, bool running) {
  BatchNormSetup s;
  const Shape c{shape[1]};
  s.x = random_tensor(shape, dt, non_contiguous, -3.0, 3.0);
  s.rx = reference::from_tensor(s.x);
  if (affine) {
    s.w = random_tensor(c, dt);
    s.b = random_tensor(c, dt);
    s.rw = reference::from_tensor(s.w);
    s.rb = reference::from_tensor(s.b);
  }
  if (running) {
    s.running_mean = random_tensor(c, DType::f32);
    s.running_var = random_tensor(c, DType::f32, false, 0.5, 2.0);
    s.rrm = reference::from_tensor(s.running_mean);
    s.rrv = reference::from_tensor(s.running_var);
  }
  return s;
}

std::string describe(const Shape& shape, DType dt, bool non_contiguous, bool training) {
  return "shape " + shape_str(shape) + (non_contiguous ? " non-contiguous " : " ") + dtype_name(dt) +
         (training ? " training" : " eval");
}

// Shapes that take the plane walk (s >= 32; planes of 37 and 7x7 elements end mid-vector) and
// the row walk (s < 32), C = 1, spatial size 1.
const Shape kFixedShapes[] = {{64, 3, 40}, {50, 7},      {2, 3, 5, 7}, {9, 1, 4}, {6, 4, 1, 1},
                              {3, 2, 1},   {2, 5, 8, 8}, {5, 3, 37},   {3, 4, 7, 7}};

}  // namespace

TEST(BatchNorm, TrainingForwardAndRunningStatsMatchReference) {
  for (DType dt : kFloatTypes) {
    for (int trial = 0; trial < 30; ++trial) {
      Shape shape = trial < 7 ? kFixedShapes[trial] : random_channel_shape(2, 4, 6);
      if (numel_of(shape) / shape[1] == 1) shape[0] = 2;  // training needs 2 values per channel
      const bool non_contiguous = coin(), affine = coin(), running = trial % 3 != 0;
      SCOPED_TRACE(describe(shape, dt, non_contiguous, true));
      BatchNormSetup s = make_setup(shape, dt, non_contiguous, affine, running);
      const double momentum = coin() ? 0.1 : 0.7;
      Tensor y = batch_norm(s.x, s.running_mean, s.running_var, s.w, s.b, true, momentum, kEps);
      const auto ref = reference::batch_norm(s.rx, running ? &s.rrm : nullptr, running ? &s.rrv : nullptr,
                                             affine ? &s.rw : nullptr, affine ? &s.rb : nullptr, true, momentum, kEps);
      EXPECT_EQ(y.dtype(), dt);
      EXPECT_EQ(y.shape(), shape);
      const double tol = tolerance(dt);
      const double atol = 4 * tol * std::max(1.0, channel_conditioning(s.rx, kEps, 2) / 100);
      EXPECT_TRUE(all_close(y, ref.y, tol, atol)) << "y";
      if (running) {
        // the running statistics are f32 whatever the input dtype
        const double stol = std::max(tol, 1e-6);
        EXPECT_TRUE(all_close(s.running_mean, ref.running_mean, stol, stol)) << "running_mean";
        EXPECT_TRUE(all_close(s.running_var, ref.running_var, stol, stol)) << "running_var";
      }
    }
  }
}

TEST(BatchNorm, EvalForwardMatchesReferenceAndLeavesRunningStats) {
  for (DType dt : kFloatTypes) {
    for (int trial = 0; trial < 20; ++trial) {
      Shape shape = trial < 7 ? kFixedShapes[trial] : random_channel_shape(2, 4, 6);
      if (trial % 4 == 0) shape[0] = 1;  // a single sample is fine in evaluation
      const bool non_contiguous = coin(), affine = coin();
      SCOPED_TRACE(describe(shape, dt, non_contiguous, false));
      BatchNormSetup s = make_setup(shape, dt, non_contiguous, affine, true);
      const Tensor rm_before = s.running_mean.clone(), rv_before = s.running_var.clone();
      Tensor y = batch_norm(s.x, s.running_mean, s.running_var, s.w, s.b, false, 0.1, kEps);
      const auto ref = reference::batch_norm(s.rx, &s.rrm, &s.rrv, affine ? &s.rw : nullptr,
                                             affine ? &s.rb : nullptr, false, 0.1, kEps);
      const double tol = tolerance(dt);
      EXPECT_TRUE(all_close(y, ref.y, tol, 8 * tol)) << "y";
      EXPECT_TRUE(all_close(s.running_mean, rm_before, 0, 0));
      EXPECT_TRUE(all_close(s.running_var, rv_before, 0, 0));
    }
  }
}

TEST(BatchNorm, LargeOffsetsKeepTheirAccuracy) {
  // sum(x^2) - n mean^2 cancels badly unless the sums are exact enough: mean 1000, spread 1
  Tensor x = add(random_tensor({16, 4, 50}, DType::f32, false, -1.0, 1.0), 1000.0);
  const RefTensor rx = reference::from_tensor(x);
  Tensor y = batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true);
  EXPECT_TRUE(all_close(y, reference::batch_norm(rx, nullptr, nullptr, nullptr, nullptr, true, 0.1, kEps).y, 1e-3,
                        2e-3));
  Tensor c = full({4, 3, 5}, 7.5);  // constant channels normalise to exactly 0
  EXPECT_TRUE(all_close(batch_norm(c, Tensor(), Tensor(), Tensor(), Tensor(), true), zeros({4, 3, 5}), 0, 0));
}

TEST(BatchNorm, BackwardMatchesReference) {
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    for (int trial = 0; trial < 24; ++trial) {
      Shape shape = trial < 7 ? kFixedShapes[trial] : random_channel_shape(2, 4, 6);
      if (numel_of(shape) / shape[1] == 1) shape[0] = 2;
      const bool training = trial % 2 == 0, non_contiguous = coin(), affine = trial % 5 != 1;
      SCOPED_TRACE(describe(shape, dt, non_contiguous, training));
      BatchNormSetup s = make_setup(shape, dt, non_contiguous, affine, !training || coin());
      Tensor x = s.x.detach().requires_grad_();
      Tensor w = affine ? s.w.detach().requires_grad_() : Tensor();
      Tensor b = affine ? s.b.detach().requires_grad_() : Tensor();
      // the reference reads the running statistics before this call moves them
      const auto rg_input = reference::from_tensor(random_tensor(shape, dt));
      Tensor g = reference::to_tensor(rg_input, dt);
      const auto ref = reference::batch_norm_backward(rg_input, s.rx, &s.rrm, &s.rrv, affine ? &s.rw : nullptr,
                                                      training, kEps);
      batch_norm(x, s.running_mean, s.running_var, w, b, training, 0.1, kEps).backward(g);
      const double gtol = grad_tolerance(dt) * std::max(1.0, channel_conditioning(s.rx, kEps, 2) / 10);
      EXPECT_TRUE(all_close(x.grad(), ref.dx, gtol, gtol)) << "dx";
      if (affine) {
        // dweight and dbias sum over the channel's n * s values
        const double ptol = gtol * double(numel_of(shape) / shape[1]);
        EXPECT_TRUE(all_close(w.grad(), ref.dweight, gtol, ptol)) << "dweight";
        EXPECT_TRUE(all_close(b.grad(), ref.dbias, gtol, ptol)) << "dbias";
      }
    }
  }
}

TEST(BatchNorm, Gradcheck) {
  for (bool training : {true, false}) {
    for (int trial = 0; trial < 4; ++trial) {
      Shape shape = random_channel_shape(2, 4, 3);
      if (numel_of(shape) / shape[1] == 1) shape[0] = 2;
      SCOPED_TRACE(shape_str(shape) + (training ? " training" : " eval"));
      Tensor x = random_tensor(shape, DType::f64, coin()).requires_grad_();
      Tensor w = random_tensor({shape[1]}, DType::f64).requires_grad_();
      Tensor b = random_tensor({shape[1]}, DType::f64).requires_grad_();
      Tensor rm = random_tensor({shape[1]}, DType::f64);
      Tensor rv = random_tensor({shape[1]}, DType::f64, false, 0.5, 2.0);
      ember::testing::expect_gradcheck(
          [&](const std::vector<Tensor>& in) {
            return std::vector<Tensor>{batch_norm(in[0], training ? Tensor() : rm, training ? Tensor() : rv, in[1],
                                                  in[2], training, 0.1, kEps)};
          },
          {x, w, b});
    }
  }
}

TEST(BatchNorm, ResultsDoNotDependOnTheThreadCount) {
  for (const Shape& shape : {Shape{64, 3, 40}, Shape{300, 7}, Shape{160, 5, 7, 7}}) {
    Tensor x = random_tensor(shape, DType::f32);
    Tensor g = random_tensor(shape, DType::f32);
    const auto [one, two] = ember::testing::with_one_and_two_threads([&] {
      Tensor xr = x.detach().requires_grad_();
      Tensor y = batch_norm(xr, Tensor(), Tensor(), Tensor(), Tensor(), true);
      y.backward(g);
      return cat({y.reshape({-1}), xr.grad().reshape({-1})}, 0);
    });
    EXPECT_TRUE(all_close(one, two, 0, 0)) << shape_str(shape);
  }
}

TEST(BatchNorm, AutocastComputesInFloat) {
  Tensor x = random_tensor({4, 3, 5}, DType::bf16);
  Tensor y_plain = batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true);
  EXPECT_EQ(y_plain.dtype(), DType::bf16);
  AutocastGuard guard(DeviceType::CPU);
  Tensor y = batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true);
  EXPECT_EQ(y.dtype(), DType::f32);
  const RefTensor ref = reference::batch_norm(reference::from_tensor(x), nullptr, nullptr, nullptr, nullptr, true,
                                              0.1, kEps)
                            .y;
  EXPECT_TRUE(all_close(y, ref, 1e-5, 1e-5));
}

// The synchronised batch norm's path on one process: each half of the batch is one rank's
// input; adding the halves' sums stands in for the all-reduce.
TEST(BatchNormPieces, SplitBatchComposesToTheWholeBatch) {
  const Shape shape{6, 3, 10};
  Tensor x = random_tensor(shape, DType::f64);
  Tensor g = random_tensor(shape, DType::f64);
  Tensor w = random_tensor({3}, DType::f64), b = random_tensor({3}, DType::f64);
  Tensor rm = zeros({3}, {DType::f64}), rv = ones({3}, {DType::f64});
  const Tensor halves[2] = {x.slice(0, 0, 2), x.slice(0, 2, 6)};  // unequal counts, as ranks may have
  const Tensor ghalves[2] = {g.slice(0, 0, 2), g.slice(0, 2, 6)};

  native::BatchNormStats total = native::batch_norm_stats(halves[0]);
  const native::BatchNormStats other = native::batch_norm_stats(halves[1]);
  EXPECT_EQ(total.count.item<double>(), 20.0);
  total = {add(total.sum, other.sum), add(total.sumsq, other.sumsq), add(total.count, other.count)};
  const native::BatchNormMeanInvstd st = native::batch_norm_gather_stats(total, DType::f64, rm, rv, 0.1, kEps);

  const RefTensor rx = reference::from_tensor(x), rw = reference::from_tensor(w), rb = reference::from_tensor(b);
  const RefTensor rrm = reference::from_tensor(zeros({3}, {DType::f64}));
  const RefTensor rrv = reference::from_tensor(ones({3}, {DType::f64}));
  const auto ref = reference::batch_norm(rx, &rrm, &rrv, &rw, &rb, true, 0.1, kEps);
  EXPECT_TRUE(all_close(rm, ref.running_mean, 1e-12, 1e-12));
  EXPECT_TRUE(all_close(rv, ref.running_var, 1e-12, 1e-12));
  Tensor y = cat({native::batch_norm_elemt(halves[0], st.mean, st.invstd, w, b),
                  native::batch_norm_elemt(halves[1], st.mean, st.invstd, w, b)},
                 0);
  EXPECT_TRUE(all_close(y, ref.y, 1e-10, 1e-10));

  native::BatchNormReduced red[2];
  for (int r = 0; r < 2; ++r)
    red[r] = native::batch_norm_backward_reduce(ghalves[r], halves[r], st.mean, st.invstd, w, b, true, true);
  const Tensor sum_dy = add(red[0].sum_dy, red[1].sum_dy), sum_dy_xmu = add(red[0].sum_dy_xmu, red[1].sum_dy_xmu);
  Tensor dx = cat({native::batch_norm_backward_elemt(ghalves[0], halves[0], st.mean, st.invstd, w, sum_dy,
                                                     sum_dy_xmu, total.count),
                   native::batch_norm_backward_elemt(ghalves[1], halves[1], st.mean, st.invstd, w, sum_dy,
                                                     sum_dy_xmu, total.count)},
                  0);
  const auto rgrad = reference::batch_norm_backward(reference::from_tensor(g), rx, nullptr, nullptr, &rw, true, kEps);
  EXPECT_TRUE(all_close(dx, rgrad.dx, 1e-9, 1e-9));
  // each rank's weight gradient is its own share; their sum is the whole batch's
  EXPECT_TRUE(all_close(add(red[0].dweight, red[1].dweight), rgrad.dweight, 1e-9, 1e-9));
  EXPECT_TRUE(all_close(add(red[0].dbias, red[1].dbias), rgrad.dbias, 1e-9, 1e-9));
}

TEST(BatchNorm, Errors) {
  Tensor x = zeros({4, 3, 5});
  const Tensor none;
  EXPECT_EMBER_ERROR(batch_norm(x, zeros({4}), ones({4}), none, none, true), "batch_norm", "running_mean", "[4]",
                     "3 channels", "[4, 3, 5]");
  EXPECT_EMBER_ERROR(batch_norm(x, none, none, ones({2}), none, true), "batch_norm", "weight", "[2]", "3 channels");
  EXPECT_EMBER_ERROR(batch_norm(x, none, none, ones({3}), zeros({3, 1}), true), "batch_norm", "bias", "[3, 1]");
  EXPECT_EMBER_ERROR(batch_norm(zeros({1, 3}), none, none, none, none, true), "batch_norm",
                     "expected more than 1 value per channel when training", "[1, 3]");
  EXPECT_EMBER_ERROR(batch_norm(zeros({1, 3, 1, 1}), none, none, none, none, true),
                     "more than 1 value per channel");
  EXPECT_EMBER_ERROR(batch_norm(x, none, none, none, none, false), "batch_norm",
                     "running_mean and running_var must be given when not training");
  EXPECT_EMBER_ERROR(batch_norm(x, zeros({3}), none, none, none, true), "batch_norm", "both");
  EXPECT_EMBER_ERROR(batch_norm(zeros({5}), none, none, none, none, true), "batch_norm", "[N, C, *]", "[5]");
  EXPECT_EMBER_ERROR(batch_norm(zeros({4, 3}, {DType::i64}), none, none, none, none, true), "batch_norm", "int64");
  // an empty batch gives an empty result and leaves the running statistics alone
  Tensor rm = zeros({3}), rv = ones({3});
  EXPECT_EQ(batch_norm(zeros({0, 3, 2}), rm, rv, none, none, true).shape(), (Shape{0, 3, 2}));
  EXPECT_TRUE(all_close(rv, ones({3}), 0, 0));
}
