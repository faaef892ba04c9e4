// CUDA batch norm (training and evaluation, running statistics, the backward pair), group norm
// and RMS norm, forward and backward through autograd, against the CPU kernels on the same
// inputs, for every float dtype; shapes that take a warp or a block per row or channel, size-1
// channels and spatial sizes. Every test skips without a CUDA device.
#include <string>
#include <vector>

#include "core/device_api.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::random_tensor;
using ember::testing::tolerance;

namespace {

const Device kGpu = Device::cuda(0);

Tensor gpu(const Tensor& t) { return t.defined() ? t.to(kGpu) : Tensor(); }
Tensor leaf(const Tensor& t) { return t.defined() ? t.detach().requires_grad_() : Tensor(); }
Tensor cpu_of(const Tensor& t) { return t.defined() ? t.to(Device::cpu()) : Tensor(); }

struct Outputs {
  Tensor y, dx, dw, db;
};

// y = op(x, w, b) and the gradients of sum(y * g), with inputs on `device`.
template <typename Op>
Outputs run(const Op& op, const Tensor& x_cpu, const Tensor& w_cpu, const Tensor& b_cpu, const Tensor& g_cpu,
            bool on_gpu) {
  auto place = [&](const Tensor& t) { return on_gpu ? gpu(t) : t; };
  Tensor x = leaf(place(x_cpu)), w = leaf(place(w_cpu)), b = leaf(place(b_cpu));
  Tensor y = op(x, w, b);
  y.backward(place(g_cpu));
  return {cpu_of(y), cpu_of(x.grad()), w.defined() ? cpu_of(w.grad()) : Tensor(),
          b.defined() ? cpu_of(b.grad()) : Tensor()};
}

template <typename Op>
void expect_gpu_matches_cpu(const Op& op, const Shape& shape, int64_t param_size, DType dt, bool with_bias,
                            const std::string& what) {
  SCOPED_TRACE(what + " " + shape_str(shape) + " " + dtype_name(dt));
  const Tensor x = random_tensor(shape, dt, false, -3.0, 3.0), g = random_tensor(shape, dt);
  const Tensor w = random_tensor({param_size}, dt), b = with_bias ? random_tensor({param_size}, dt) : Tensor();
  const Outputs c = run(op, x, w, b, g, false), d = run(op, x, w, b, g, true);
  const double tol = 4 * tolerance(dt);
  EXPECT_TRUE(all_close(d.y, c.y, tol, tol)) << "y";
  EXPECT_TRUE(all_close(d.dx, c.dx, tol, tol)) << "dx";
  const double ptol = tol * double(numel_of(shape) / param_size);
  EXPECT_TRUE(all_close(d.dw, c.dw, tol, ptol)) << "dweight";
  if (with_bias) {
    EXPECT_TRUE(all_close(d.db, c.db, tol, ptol)) << "dbias";
  }
}

const DType kDtypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16};

}  // namespace

TEST(CudaBatchNorm, TrainingMatchesCpuWithRunningStats) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : kDtypes)
    for (const Shape& shape : {Shape{64, 3, 40}, Shape{50, 7}, Shape{2, 1, 5, 7}, Shape{6, 4, 1, 1}, Shape{8, 16, 32, 33}}) {
      const int64_t c = shape[1];
      const Tensor rm0 = random_tensor({c}), rv0 = random_tensor({c}, DType::f32, false, 0.5, 2.0);
      Tensor rm_cpu = rm0.clone(), rv_cpu = rv0.clone(), rm_gpu = gpu(rm0), rv_gpu = gpu(rv0);
      expect_gpu_matches_cpu(
          [&](const Tensor& x, const Tensor& w, const Tensor& b) {
            const bool on_gpu = x.device() == kGpu;
            return batch_norm(x, on_gpu ? rm_gpu : rm_cpu, on_gpu ? rv_gpu : rv_cpu, w, b, true, 0.2);
          },
          shape, c, dt, true, "batch_norm training");
      EXPECT_TRUE(all_close(cpu_of(rm_gpu), rm_cpu, 1e-5, 1e-6)) << "running_mean " << shape_str(shape);
      EXPECT_TRUE(all_close(cpu_of(rv_gpu), rv_cpu, 1e-5, 1e-6)) << "running_var " << shape_str(shape);
    }
}

TEST(CudaBatchNorm, EvalMatchesCpu) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : kDtypes)
    for (const Shape& shape : {Shape{1, 3, 40}, Shape{5, 7}, Shape{4, 2, 3, 3}}) {
      const Tensor rm = random_tensor({shape[1]}), rv = random_tensor({shape[1]}, DType::f32, false, 0.5, 2.0);
      expect_gpu_matches_cpu(
          [&](const Tensor& x, const Tensor& w, const Tensor& b) {
            const bool on_gpu = x.device() == kGpu;
            return batch_norm(x, on_gpu ? gpu(rm) : rm, on_gpu ? gpu(rv) : rv, w, b, false);
          },
          shape, shape[1], dt, true, "batch_norm eval");
    }
}

TEST(CudaGroupNorm, MatchesCpu) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : kDtypes)
    for (const auto& [shape, groups] : std::vector<std::pair<Shape, int64_t>>{
             {{2, 6, 40}, 3}, {{5, 4}, 2}, {{1, 1, 3}, 1}, {{3, 8, 1, 1}, 8}, {{2, 64, 32, 32}, 32}}) {
      expect_gpu_matches_cpu(
          [&](const Tensor& x, const Tensor& w, const Tensor& b) { return group_norm(x, groups, w, b); }, shape,
          shape[1], dt, true, "group_norm groups " + std::to_string(groups));
    }
}

TEST(CudaRmsNorm, MatchesCpu) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : kDtypes)
    for (const Shape& shape : {Shape{3, 17}, Shape{4, 1024}, Shape{3, 3000}, Shape{6, 1}, Shape{300, 64}}) {
      const int64_t cols = shape.back();
      expect_gpu_matches_cpu([&](const Tensor& x, const Tensor& w, const Tensor&) { return rms_norm(x, {cols}, w); },
                             shape, cols, dt, false, "rms_norm");
    }
}
