// Batch norm on cuDNN (kernels/cuda/normalization_batch_norm_cudnn.cu) against the CPU kernels,
// Ember's own CUDA kernels (the switch off) and the double reference: training forward with the
// saved statistics and the running ones, evaluation forward, the input, weight and bias
// gradients; f32, f16 and bf16; [N, C], [N, C, L], [N, C, H, W] and 5-D input; channels-last,
// strided and offset views; no affine parameters or no running statistics; several steps of
// nn::BatchNorm2d with a momentum and with the cumulative average; a single sample with spatial
// size; one value per channel (an error in training, as in PyTorch); inputs past cuDNN's limits
// handed back to Ember's kernels. The counters show which path each call took. Every test skips
// without a CUDA device.
#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "core/device_api.h"
#include "kernels/cuda/cudnn_batch_norm.h"
#include "kernels/reference/normalization.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::random_tensor;
using ember::testing::tolerance;
using reference::RefTensor;

namespace {

const Device kGpu = Device::cuda(0);
constexpr double kEps = 1e-5;
const DType kCudnnDtypes[] = {DType::f32, DType::f16, DType::bf16};

Tensor on(const Tensor& t, Device d) { return t.defined() ? t.to(d) : Tensor(); }
Tensor cpu(const Tensor& t) { return on(t, Device::cpu()); }
Tensor leaf(const Tensor& t) { return t.defined() ? t.detach().requires_grad_() : Tensor(); }

// Turns cuDNN batch norm on or off for a scope, then back on (the default).
struct CudnnSwitch {
  explicit CudnnSwitch(bool on) { cuda::set_cudnn_batch_norm(on); }
  ~CudnnSwitch() { cuda::set_cudnn_batch_norm(true); }
};

// The inputs of one batch norm call (CPU tensors); weight, bias and running statistics each
// may be undefined.
struct Problem {
  Tensor x, w, b, g, rm, rv;
  bool training = true;
  double momentum = 0.1, eps = kEps;
};

// Its results (CPU tensors): y, the three gradients and the running statistics after the call.
struct Result {
  Tensor y, dx, dw, db, rm, rv;
};

// Runs p on `device` (x shaped by `view` there: a permuted or sliced view), the gradients of
// sum(y * g) included.
template <typename View>
Result run_on(Device device, const Problem& p, const View& view) {
  Tensor x = leaf(on(p.x, device)), w = leaf(on(p.w, device)), b = leaf(on(p.b, device));
  Tensor rm = on(p.rm, device), rv = on(p.rv, device);
  Tensor y = batch_norm(view(x), rm, rv, w, b, p.training, p.momentum, p.eps);
  y.backward(on(p.g, device));
  return {cpu(y), cpu(x.grad()), w.defined() ? cpu(w.grad()) : Tensor(), b.defined() ? cpu(b.grad()) : Tensor(),
          cpu(rm), cpu(rv)};
}
Result run_on(Device device, const Problem& p) {
  return run_on(device, p, [](const Tensor& x) { return x; });
}

// x of `shape` in dt with values in [-3, 3); weight and bias in w_dtype (f32: a layer's
// parameters; dt: converted ones); running statistics f32.
Problem make_problem(const Shape& shape, DType dt, DType w_dtype, bool affine, bool running, bool training) {
  Problem p;
  const Shape c{shape[1]};
  p.x = random_tensor(shape, dt, false, -3.0, 3.0);
  p.g = random_tensor(shape, dt);
  if (affine) {
    p.w = random_tensor(c, w_dtype, false, 0.5, 1.5);
    p.b = random_tensor(c, w_dtype);
  }
  if (running) {
    p.rm = random_tensor(c, DType::f32);
    p.rv = random_tensor(c, DType::f32, false, 0.5, 2.0);
  }
  p.training = training;
  return p;
}

// y and dx within a few units of dt's rounding; the parameter gradients and running statistics
// are sums over a channel's values, so their tolerance grows with the count.
void expect_close(const Result& got, const Result& want, const Problem& p, const std::string& what) {
  SCOPED_TRACE(what);
  const double tol = 4 * tolerance(p.x.dtype());
  const double per_channel = double(p.x.numel() / std::max<int64_t>(p.x.shape()[1], 1));
  const double ptol = tol * std::max(1.0, per_channel / 8);
  EXPECT_TRUE(all_close(got.y, want.y, tol, tol)) << "y";
  EXPECT_TRUE(all_close(got.dx, want.dx, tol, ptol)) << "dx";
  if (p.w.defined()) {
    EXPECT_TRUE(all_close(got.dw, want.dw, tol, ptol)) << "dweight";
  }
  if (p.b.defined()) {
    EXPECT_TRUE(all_close(got.db, want.db, tol, ptol)) << "dbias";
  }
  if (p.rm.defined()) {
    // the running statistics are f32 whatever the input dtype, made of the same input values
    EXPECT_TRUE(all_close(got.rm, want.rm, 1e-5, 1e-5)) << "running_mean";
    EXPECT_TRUE(all_close(got.rv, want.rv, 1e-4, 1e-5)) << "running_var";
  }
}

cuda::CudnnBatchNormCounts counts_since(const cuda::CudnnBatchNormCounts& before) {
  const cuda::CudnnBatchNormCounts now = cuda::cudnn_batch_norm_counts();
  return {now.forward_training - before.forward_training, now.forward_inference - before.forward_inference,
          now.backward - before.backward, now.declined - before.declined};
}

// [N, C] and [N, C, L] (BatchNorm1d), [N, C, H, W] (BatchNorm2d), 5-D; a single sample with a
// spatial size; a spatial size of 1 in a 4-D input; a channel count past a warp.
const Shape kShapes[] = {{32, 5}, {16, 4, 9}, {4, 3, 5, 7}, {1, 3, 4, 5}, {6, 4, 1, 1}, {3, 2, 2, 3, 4}, {8, 40, 6, 6}};

}  // namespace

TEST(CudnnBatchNorm, TrainingForwardGradientsAndRunningStatsMatchCpu) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : kCudnnDtypes)
    for (const Shape& shape : kShapes)
      for (DType w_dtype : {DType::f32, dt}) {
        const std::string what = shape_str(shape) + " " + dtype_name(dt) + " weight " + dtype_name(w_dtype);
        const Problem p = make_problem(shape, dt, w_dtype, true, true, true);
        const Result want = run_on(Device::cpu(), p);
        const auto before = cuda::cudnn_batch_norm_counts();
        const Result got = run_on(kGpu, p);
        const auto ran = counts_since(before);
        expect_close(got, want, p, what);
        EXPECT_EQ(ran.forward_training, 1) << what << ": the forward did not run on cuDNN";
        EXPECT_EQ(ran.backward, 1) << what << ": the backward did not run on cuDNN";
        EXPECT_EQ(ran.declined, 0) << what;
      }
}

TEST(CudnnBatchNorm, EvalForwardAndGradientsMatchCpu) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : kCudnnDtypes)
    for (const Shape& shape : {Shape{32, 5}, Shape{1, 5}, Shape{1, 3, 40}, Shape{4, 3, 5, 7}, Shape{1, 6, 1, 1}}) {
      const std::string what = shape_str(shape) + " " + dtype_name(dt) + " eval";
      const Problem p = make_problem(shape, dt, DType::f32, true, true, false);
      const Result want = run_on(Device::cpu(), p);
      const auto before = cuda::cudnn_batch_norm_counts();
      const Result got = run_on(kGpu, p);
      const auto ran = counts_since(before);
      expect_close(got, want, p, what);
      // evaluation leaves the running statistics as they were
      EXPECT_TRUE(all_close(got.rm, p.rm, 0, 0)) << what;
      EXPECT_TRUE(all_close(got.rv, p.rv, 0, 0)) << what;
      EXPECT_EQ(ran.forward_inference, 1) << what << ": the forward did not run on cuDNN";
      EXPECT_EQ(ran.backward, 0) << what << ": fixed statistics take Ember's backward";
    }
}

TEST(CudnnBatchNorm, MatchesTheDoubleReference) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (bool training : {true, false})
    for (const Shape& shape : {Shape{8, 3, 6, 6}, Shape{64, 7}, Shape{5, 2, 33}}) {
      SCOPED_TRACE(shape_str(shape) + (training ? " training" : " eval"));
      const Problem p = make_problem(shape, DType::f32, DType::f32, true, true, training);
      const Result got = run_on(kGpu, p);
      const RefTensor rx = reference::from_tensor(p.x), rw = reference::from_tensor(p.w),
                      rb = reference::from_tensor(p.b), rm = reference::from_tensor(p.rm),
                      rv = reference::from_tensor(p.rv), rg = reference::from_tensor(p.g);
      const auto ref = reference::batch_norm(rx, &rm, &rv, &rw, &rb, training, p.momentum, p.eps);
      const auto grads = reference::batch_norm_backward(rg, rx, &rm, &rv, &rw, training, p.eps);
      EXPECT_TRUE(all_close(got.y, ref.y, 1e-4, 1e-4)) << "y";
      EXPECT_TRUE(all_close(got.dx, grads.dx, 1e-4, 1e-4)) << "dx";
      EXPECT_TRUE(all_close(got.dw, grads.dweight, 1e-4, 1e-3)) << "dweight";
      EXPECT_TRUE(all_close(got.db, grads.dbias, 1e-4, 1e-3)) << "dbias";
      EXPECT_TRUE(all_close(got.rm, ref.running_mean, 1e-5, 1e-6)) << "running_mean";
      EXPECT_TRUE(all_close(got.rv, ref.running_var, 1e-5, 1e-6)) << "running_var (unbiased, as PyTorch)";
    }
}

TEST(CudnnBatchNorm, AgreesWithEmbersOwnKernels) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : kCudnnDtypes)
    for (bool training : {true, false})
      for (const Shape& shape : {Shape{32, 5}, Shape{16, 4, 9}, Shape{4, 3, 5, 7}}) {
        const std::string what = shape_str(shape) + " " + dtype_name(dt) + (training ? " training" : " eval");
        const Problem p = make_problem(shape, dt, DType::f32, true, true, training);
        const Result with_cudnn = run_on(kGpu, p);
        Result own;
        {
          CudnnSwitch off(false);
          const auto before = cuda::cudnn_batch_norm_counts();
          own = run_on(kGpu, p);
          const auto ran = counts_since(before);
          EXPECT_EQ(ran.forward_training + ran.forward_inference + ran.backward, 0) << what << ": switched off";
          EXPECT_GE(ran.declined, 1) << what;
        }
        expect_close(with_cudnn, own, p, what + " cuDNN vs Ember's kernels");
      }
}

TEST(CudnnBatchNorm, WithoutAffineOrRunningStats) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : kCudnnDtypes)
    for (bool affine : {false, true})
      for (bool running : {false, true}) {
        const std::string what = std::string(dtype_name(dt)) + (affine ? " affine" : " no affine") +
                                 (running ? " running stats" : " no running stats");
        const Problem p = make_problem({6, 3, 4, 5}, dt, DType::f32, affine, running, true);
        const auto before = cuda::cudnn_batch_norm_counts();
        const Result got = run_on(kGpu, p);
        EXPECT_EQ(counts_since(before).forward_training, 1) << what;
        expect_close(got, run_on(Device::cpu(), p), p, what);
      }
}

TEST(CudnnBatchNorm, ChannelsLastAndStridedInputs) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : kCudnnDtypes) {
    // channels last: [N, H, W, C] memory seen as [N, C, H, W]
    {
      Problem p = make_problem({4, 3, 5, 6}, dt, DType::f32, true, true, true);
      p.x = random_tensor({4, 5, 6, 3}, dt, false, -3.0, 3.0);
      const auto nhwc = [](const Tensor& x) { return x.permute({0, 3, 1, 2}); };
      SCOPED_TRACE(std::string("channels last ") + dtype_name(dt));
      Problem logical = p;  // for the tolerances: the shape the op sees
      logical.x = nhwc(p.x);
      expect_close(run_on(kGpu, p, nhwc), run_on(Device::cpu(), p, nhwc), logical, "channels last");
    }
    // every other element of the last dim
    Problem p = make_problem({5, 3, 4, 10}, dt, DType::f32, true, true, true);
    const auto strided = [](const Tensor& x) { return x.slice(3, 0, 10, 2); };
    Problem logical = p;
    logical.x = strided(p.x);
    p.g = random_tensor(logical.x.shape(), dt);
    logical.g = p.g;
    expect_close(run_on(kGpu, p, strided), run_on(Device::cpu(), p, strided), logical,
                 std::string("strided ") + dtype_name(dt));
  }
}

TEST(CudnnBatchNorm, BatchNorm2dRunningStatsOverSeveralSteps) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (std::optional<double> momentum : {std::optional<double>(0.1), std::optional<double>()}) {
    SCOPED_TRACE(momentum ? "momentum 0.1" : "cumulative average");
    nn::BatchNorm2d on_cpu(3, {.momentum = momentum}), on_gpu(3, {.momentum = momentum});
    on_gpu.to(kGpu);
    const auto before = cuda::cudnn_batch_norm_counts();
    for (int step = 0; step < 5; ++step) {
      // each batch with its own offset and scale, so a wrong weighting of the steps shows
      const Tensor x = add(mul(random_tensor({4, 3, 5, 6}), 1.0 + step), 0.5 * step);
      on_cpu.forward(x);
      on_gpu.forward(x.to(kGpu));
    }
    EXPECT_EQ(counts_since(before).forward_training, 5);
    EXPECT_EQ(cpu(on_gpu.num_batches_tracked).item<int64_t>(), 5);
    EXPECT_TRUE(all_close(cpu(on_gpu.running_mean), on_cpu.running_mean, 1e-5, 1e-6)) << "running_mean";
    EXPECT_TRUE(all_close(cpu(on_gpu.running_var), on_cpu.running_var, 1e-5, 1e-6)) << "running_var";
    on_cpu.eval();
    on_gpu.eval();
    const Tensor x = random_tensor({2, 3, 5, 6});
    EXPECT_TRUE(all_close(cpu(on_gpu.forward(x.to(kGpu))), on_cpu.forward(x), 1e-5, 1e-5)) << "eval output";
  }
}

TEST(CudnnBatchNorm, BatchNorm1dWithoutAffineOrTrackingMatchesCpu) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (const Shape& shape : {Shape{16, 4}, Shape{8, 4, 7}}) {
    SCOPED_TRACE(shape_str(shape));
    nn::BatchNorm1d on_cpu(4, {.affine = false, .track_running_stats = false}),
        on_gpu(4, {.affine = false, .track_running_stats = false});
    on_gpu.to(kGpu);
    for (bool training : {true, false}) {  // untracked: batch statistics in evaluation too
      on_cpu.train(training);
      on_gpu.train(training);
      const Tensor x = random_tensor(shape);
      Tensor xc = leaf(x), xg = leaf(x.to(kGpu));
      const Tensor g = random_tensor(shape);
      Tensor yc = on_cpu.forward(xc), yg = on_gpu.forward(xg);
      yc.backward(g);
      yg.backward(g.to(kGpu));
      EXPECT_TRUE(all_close(cpu(yg), yc, 1e-5, 1e-5)) << "y";
      EXPECT_TRUE(all_close(cpu(xg.grad()), xc.grad(), 1e-4, 1e-5)) << "dx";
    }
  }
}

TEST(CudnnBatchNorm, OneValuePerChannelIsAnErrorInTrainingOnly) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (const Shape& shape : {Shape{1, 4}, Shape{1, 4, 1}, Shape{1, 4, 1, 1}}) {
    SCOPED_TRACE(shape_str(shape));
    const Tensor x = random_tensor(shape).to(kGpu);
    const Tensor rm = zeros({4}, {DType::f32, kGpu}), rv = ones({4}, {DType::f32, kGpu});
    EXPECT_EMBER_ERROR(batch_norm(x, rm, rv, Tensor(), Tensor(), true), "batch_norm",
                       "expected more than 1 value per channel when training", shape_str(shape));
    // the running statistics stay as they were
    EXPECT_TRUE(all_close(cpu(rm), zeros({4}), 0, 0));
    EXPECT_TRUE(all_close(cpu(rv), ones({4}), 0, 0));
    // evaluation normalises a single value with the running statistics
    Problem p = make_problem(shape, DType::f32, DType::f32, true, true, false);
    expect_close(run_on(kGpu, p), run_on(Device::cpu(), p), p, "eval");
  }
}

TEST(CudnnBatchNorm, LargeOffsetsKeepTheirAccuracy) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  // mean 1000, spread 1: a variance from sum(x^2) - n mean^2 in f32 would lose it all
  const Tensor x = add(random_tensor({16, 4, 50}, DType::f32, false, -1.0, 1.0), 1000.0);
  const auto before = cuda::cudnn_batch_norm_counts();
  const Tensor y = batch_norm(x.to(kGpu), Tensor(), Tensor(), Tensor(), Tensor(), true);
  EXPECT_EQ(counts_since(before).forward_training, 1);
  const RefTensor rx = reference::from_tensor(x);
  EXPECT_TRUE(all_close(cpu(y), reference::batch_norm(rx, nullptr, nullptr, nullptr, nullptr, true, 0.1, kEps).y,
                        1e-3, 2e-3));
}

TEST(CudnnBatchNorm, ProblemsPastItsLimitsRunEmbersKernels) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  // a batch past the largest spatial-mode evaluation batch, an empty batch, and f64
  const auto check = [](const Problem& p, const std::string& what, bool counted) {
    const auto before = cuda::cudnn_batch_norm_counts();
    const Result got = run_on(kGpu, p);
    const auto ran = counts_since(before);
    EXPECT_EQ(ran.forward_training + ran.forward_inference + ran.backward, 0) << what;
    if (counted) {
      EXPECT_GE(ran.declined, 1) << what;
    }
    expect_close(got, run_on(Device::cpu(), p), p, what);
  };
  check(make_problem({65536, 1, 2, 1}, DType::f32, DType::f32, true, true, false), "batch 65536, eval", true);
  check(make_problem({0, 3, 4}, DType::f32, DType::f32, true, true, true), "empty batch", false);
  check(make_problem({4, 3, 5}, DType::f64, DType::f64, true, true, true), "f64", false);
}

// Last among the device tests: were cuDNN to read misaligned vectors, the error it left on the
// device would fail every test after it.
TEST(CudnnBatchNorm, InputNotOnA16ByteBoundary) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : kCudnnDtypes) {
    // a contiguous view starting one element into its buffer
    const Shape shape{5, 3, 4, 10};
    const int64_t n = numel_of(shape);
    Problem p = make_problem(shape, dt, DType::f32, true, true, true);
    p.x = random_tensor({1 + n}, dt, false, -3.0, 3.0);
    const auto offset = [&](const Tensor& x) { return x.slice(0, 1, 1 + n).view(shape); };
    Problem logical = p;
    logical.x = offset(p.x);
    const auto before = cuda::cudnn_batch_norm_counts();
    const Result got = run_on(kGpu, p, offset);
    EXPECT_EQ(counts_since(before).forward_training, 1);
    expect_close(got, run_on(Device::cpu(), p, offset), logical, std::string("offset ") + dtype_name(dt));
  }
}

TEST(CudnnBatchNorm, SwitchDefaultsOnAndCanBeSet) {
  // no device needed: the switch is host state
  if (std::getenv("EMBER_CUDNN_BATCH_NORM") != nullptr) GTEST_SKIP() << "EMBER_CUDNN_BATCH_NORM is set";
  EXPECT_TRUE(cuda::cudnn_batch_norm());
  cuda::set_cudnn_batch_norm(false);
  EXPECT_FALSE(cuda::cudnn_batch_norm());
  cuda::set_cudnn_batch_norm(true);
  EXPECT_TRUE(cuda::cudnn_batch_norm());
}
