// CUDA convolutions on cuDNN against the CPU kernels on the same inputs: conv2d over stride,
// numeric and "same" padding, dilation, groups, depthwise and 1x1 geometries, conv1d, and
// conv_transpose2d with an output padding past its padding (cuDNN sees a narrowed input view),
// forward and every gradient, in every float dtype. Also: plans are cached per shape, the
// benchmarked choice computes the same values, results do not vary between runs, an empty
// batch gives a zero weight gradient, and f32 stays off TF32 unless allowed. Every test
// skips without a CUDA device.
#include <string>
#include <vector>

#include "core/device_api.h"
#include "kernels/cuda/cublas_handles.h"
#include "kernels/cuda/cudnn_conv_plans.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::kFloatTypes;
using ember::testing::random_tensor;
using ember::testing::tolerance;

namespace {

const Device kGpu = Device::cuda(0);

Tensor on(const Tensor& t, Device d) { return t.defined() ? t.to(d) : Tensor(); }
Tensor leaf(const Tensor& t) { return t.defined() ? t.detach().requires_grad_() : Tensor(); }

struct Grads {
  Tensor y, dx, dw, db;
};

// y = op(x, w, b) on `device` and the gradients of sum(y * g), brought back to the CPU.
template <typename Op>
Grads run_on(Device device, const Op& op, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& g) {
  Tensor xd = leaf(on(x, device)), wd = leaf(on(w, device)), bd = leaf(on(b, device));
  Tensor y = op(xd, wd, bd);
  y.backward(on(g, device));
  return {on(y, Device::cpu()), on(xd.grad(), Device::cpu()), on(wd.grad(), Device::cpu()),
          bd.defined() ? on(bd.grad(), Device::cpu()) : Tensor()};
}

// Runs op on the CPU and the GPU and compares the output and the three gradients. Each value
// is a sum of `terms` products, so the tolerance grows with it.
template <typename Op>
void expect_gpu_matches_cpu(const Op& op, const Shape& x_shape, const Shape& w_shape, bool bias, DType dt,
                            const std::string& what) {
  SCOPED_TRACE(what + " x " + shape_str(x_shape) + " w " + shape_str(w_shape) + " " + dtype_name(dt));
  const Tensor x = random_tensor(x_shape, dt), w = random_tensor(w_shape, dt);
  const Tensor b = bias ? random_tensor({w_shape[0]}, dt) : Tensor();
  Tensor y_shape_probe = op(x, w, b);
  const Tensor g = random_tensor(y_shape_probe.shape(), dt);
  const Grads c = run_on(Device::cpu(), op, x, w, b, g), d = run_on(kGpu, op, x, w, b, g);
  int64_t terms = 1;
  for (size_t i = 1; i < w_shape.size(); ++i) terms *= w_shape[i];
  const double tol = tolerance(dt) * double(terms);
  const double reduce_tol = tolerance(dt) * double(y_shape_probe.numel() / w_shape[0] + terms);
  EXPECT_TRUE(all_close(d.y, c.y, tol, tol)) << "y";
  EXPECT_TRUE(all_close(d.dx, c.dx, tol, tol)) << "dx";
  EXPECT_TRUE(all_close(d.dw, c.dw, reduce_tol, reduce_tol)) << "dw";
  if (bias) {
    EXPECT_TRUE(all_close(d.db, c.db, reduce_tol, reduce_tol)) << "db";
  }
}

struct Conv2dCase {
  const char* name;
  Shape x, w, stride;
  ConvPadding padding;
  Shape dilation;
  int64_t groups;
  bool bias;
};

std::vector<Conv2dCase> conv2d_cases() {
  return {
      {"plain", {2, 3, 7, 6}, {4, 3, 3, 3}, {1, 1}, Shape{0, 0}, {1, 1}, 1, true},
      {"stride and padding", {2, 3, 8, 7}, {4, 3, 3, 3}, {2, 2}, Shape{1, 1}, {1, 1}, 1, true},
      {"uneven stride", {3, 2, 9, 8}, {5, 2, 3, 2}, {2, 3}, Shape{0, 0}, {1, 1}, 1, false},
      {"dilation", {2, 2, 9, 9}, {3, 2, 3, 2}, {1, 2}, Shape{1, 0}, {2, 3}, 1, true},
      {"groups", {2, 6, 6, 5}, {4, 3, 2, 3}, {1, 1}, Shape{1, 1}, {1, 1}, 2, true},
      {"depthwise", {2, 4, 6, 6}, {8, 1, 3, 3}, {1, 1}, Shape{1, 1}, {1, 1}, 4, true},
      {"same even kernel", {2, 3, 6, 5}, {2, 3, 4, 2}, {1, 1}, "same", {1, 1}, 1, true},
      {"1x1 stride 2", {2, 8, 14, 14}, {16, 8, 1, 1}, {2, 2}, Shape{0, 0}, {1, 1}, 1, false},
      {"resnet stem", {2, 3, 32, 32}, {16, 3, 7, 7}, {2, 2}, Shape{3, 3}, {1, 1}, 1, false},
      {"first layer", {8, 1, 28, 28}, {32, 1, 3, 3}, {1, 1}, Shape{1, 1}, {1, 1}, 1, true},
  };
}

Tensor run_conv2d(const Conv2dCase& c, const Tensor& x, const Tensor& w, const Tensor& b) {
  return conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups);
}

}  // namespace

TEST(CudaConvolution, Conv2dForwardAndGradientsMatchCpu) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : kFloatTypes)
    for (const Conv2dCase& c : conv2d_cases())
      expect_gpu_matches_cpu([&](const Tensor& x, const Tensor& w, const Tensor& b) { return run_conv2d(c, x, w, b); },
                             c.x, c.w, c.bias, dt, c.name);
}

TEST(CudaConvolution, Conv1dMatchesCpu) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : kFloatTypes) {
    expect_gpu_matches_cpu([](const Tensor& x, const Tensor& w, const Tensor& b) { return conv1d(x, w, b, 2, 1, 1, 1); },
                           {3, 4, 17}, {6, 4, 5}, true, dt, "conv1d stride 2");
    expect_gpu_matches_cpu(
        [](const Tensor& x, const Tensor& w, const Tensor& b) { return conv1d(x, w, b, 1, "same", 2, 2); },
        {2, 4, 16}, {4, 2, 3}, false, dt, "conv1d same dilated grouped");
  }
}

TEST(CudaConvolution, ConvTranspose2dMatchesCpuIncludingOutputPaddingPastThePadding) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : kFloatTypes) {
    // output_padding 1 > padding 0: the last output row is reached by no input (a narrowed view).
    expect_gpu_matches_cpu(
        [](const Tensor& x, const Tensor& w, const Tensor& b) {
          return conv_transpose2d(x, w, b, {2, 2}, {0, 0}, {1, 1});
        },
        {2, 4, 5, 5}, {4, 3, 3, 3}, true, dt, "transpose, output padding 1");
    expect_gpu_matches_cpu(
        [](const Tensor& x, const Tensor& w, const Tensor& b) {
          return conv_transpose2d(x, w, b, {3, 2}, {1, 1}, {2, 1}, 2, {1, 2});
        },
        {2, 4, 4, 5}, {4, 2, 2, 3}, false, dt, "transpose, grouped, dilated");
  }
}

TEST(CudaConvolution, PlansAreCachedPerShapeAndBenchmarkingComputesTheSameValues) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const Tensor x = random_tensor({4, 8, 12, 12}, DType::f32).to(kGpu);
  const Tensor w = random_tensor({16, 8, 3, 3}, DType::f32).to(kGpu);
  const Tensor first = conv2d(x, w, Tensor(), {1, 1}, Shape{1, 1});
  const size_t plans = cuda::cudnn_conv_plan_count();
  const Tensor again = conv2d(x, w, Tensor(), {1, 1}, Shape{1, 1});
  EXPECT_EQ(cuda::cudnn_conv_plan_count(), plans) << "the same shape built a second plan";
  EXPECT_TRUE(all_close(again.to(Device::cpu()), first.to(Device::cpu()), 0, 0)) << "runs differ";
  conv2d(x, w, Tensor(), {2, 2}, Shape{1, 1});
  EXPECT_EQ(cuda::cudnn_conv_plan_count(), plans + 1) << "a new stride reused a plan";

  cuda::set_cudnn_benchmark(true);
  const Tensor benchmarked = conv2d(x, w, Tensor(), {1, 1}, Shape{1, 1});
  cuda::set_cudnn_benchmark(false);
  EXPECT_EQ(cuda::cudnn_conv_plan_count(), plans + 2) << "benchmarking has its own plans";
  const Tensor cpu = conv2d(x.to(Device::cpu()), w.to(Device::cpu()), Tensor(), {1, 1}, Shape{1, 1});
  EXPECT_TRUE(all_close(benchmarked.to(Device::cpu()), cpu, 1e-4, 1e-4));
}

TEST(CudaConvolution, GradientsDoNotVaryBetweenRuns) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const Tensor x = random_tensor({16, 32, 14, 14}, DType::f32), w = random_tensor({64, 32, 3, 3}, DType::f32);
  const Tensor g = random_tensor({16, 64, 14, 14}, DType::f32);
  auto op = [](const Tensor& a, const Tensor& b, const Tensor& c) { return conv2d(a, b, c, {1, 1}, Shape{1, 1}); };
  const Grads first = run_on(kGpu, op, x, w, Tensor(), g), second = run_on(kGpu, op, x, w, Tensor(), g);
  EXPECT_TRUE(all_close(second.dw, first.dw, 0, 0)) << "weight gradient";
  EXPECT_TRUE(all_close(second.dx, first.dx, 0, 0)) << "input gradient";
}

TEST(CudaConvolution, EmptyBatchGivesZeroWeightGradient) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  Tensor x = zeros({0, 3, 6, 6}).to(kGpu).requires_grad_();
  Tensor w = random_tensor({4, 3, 3, 3}, DType::f32).to(kGpu).requires_grad_();
  Tensor y = conv2d(x, w, Tensor(), {1, 1}, Shape{1, 1});
  EXPECT_EQ(y.shape(), (Shape{0, 4, 6, 6}));
  y.sum().backward();
  EXPECT_TRUE(all_close(w.grad().to(Device::cpu()), zeros({4, 3, 3, 3}), 0, 0));
}

TEST(CudaConvolution, F32StaysOffTf32UnlessAllowed) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  // Inputs with bits below TF32's 10-bit mantissa: a TF32 engine would lose them.
  const Tensor x = random_tensor({8, 64, 16, 16}, DType::f32), w = random_tensor({64, 64, 3, 3}, DType::f32);
  const Tensor want = conv2d(x.to(DType::f64), w.to(DType::f64), Tensor(), {1, 1}, Shape{1, 1});
  const bool was = cuda::allow_tf32();
  cuda::set_allow_tf32(false);
  const Tensor got = conv2d(x.to(kGpu), w.to(kGpu), Tensor(), {1, 1}, Shape{1, 1}).to(Device::cpu());
  cuda::set_allow_tf32(was);
  // f32 accumulation of 576 products of values below 1 stays within 1e-4; TF32 rounding of
  // the inputs alone moves results by ~1e-3 relative.
  EXPECT_TRUE(all_close(got.to(DType::f64), want, 2e-4, 2e-4));
}
