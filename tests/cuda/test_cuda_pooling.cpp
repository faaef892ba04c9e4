// CUDA max, average and adaptive average pooling, forward and backward, against the CPU kernels
// on the same inputs: overlapping, padded, dilated and ceil-mode windows, batched and unbatched,
// every float dtype. The max pool's output and indices must match exactly (both scan windows
// in the same order); sums may differ by rounding. Every test skips without a CUDA device.
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/device_api.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::kFloatTypes;
using ember::testing::random_tensor;
using ember::testing::tolerance;

namespace {

const Device kGpu = Device::cuda(0);

struct Case {
  Shape input, kernel, stride, padding, dilation;
  bool ceil_mode;
};

std::vector<Case> cases() {
  return {
      {{2, 3, 8, 8}, {2}, {}, {0}, {1}, false},        {{2, 3, 7, 9}, {2}, {}, {0}, {1}, true},
      {{2, 2, 6, 7}, {3}, {1}, {1}, {1}, false},       {{1, 3, 7, 9}, {3}, {2}, {1}, {1}, true},
      {{3, 7, 6}, {3, 2}, {2, 1}, {1, 0}, {1}, false}, {{1, 2, 9, 8}, {3}, {2}, {1}, {2, 1}, true},
      {{16, 32, 28, 28}, {2}, {}, {0}, {1}, false},
  };
}

std::string describe(const Case& c, DType dt) {
  return ::testing::PrintToString(c.input) + " kernel " + ::testing::PrintToString(c.kernel) + " " + dtype_name(dt);
}

Tensor cpu(const Tensor& t) { return t.to(Device::cpu()); }

// Runs f on x (CPU) and on a GPU copy of x, backpropagates the same gradient through both,
// and compares outputs and input gradients.
template <typename F>
void expect_same_on_both(const Tensor& x_host, const F& f, double tol) {
  Tensor xc = x_host.detach().requires_grad_();
  Tensor xg = x_host.to(kGpu).detach().requires_grad_();
  Tensor yc = f(xc), yg = f(xg);
  EXPECT_EQ(yg.device(), kGpu);
  EXPECT_TRUE(all_close(cpu(yg), yc, tol, tol));
  Tensor g = random_tensor(yc.shape(), yc.dtype());
  yc.backward(g);
  yg.backward(g.to(kGpu));
  EXPECT_TRUE(all_close(cpu(xg.grad()), xc.grad(), tol, tol));
}

}  // namespace

TEST(CudaPooling, MaxPoolMatchesCpu) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (const Case& c : cases())
    for (DType dt : kFloatTypes) {
      SCOPED_TRACE(describe(c, dt));
      expect_same_on_both(
          random_tensor(c.input, dt, true),
          [&](const Tensor& x) { return max_pool2d(x, c.kernel, c.stride, c.padding, c.dilation, c.ceil_mode); },
          tolerance(dt));
    }
}

TEST(CudaPooling, AvgPoolMatchesCpu) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (const Case& c : cases())
    for (bool include_pad : {true, false})
      for (DType dt : kFloatTypes) {
        SCOPED_TRACE(describe(c, dt) + (include_pad ? " count_include_pad" : ""));
        expect_same_on_both(random_tensor(c.input, dt, true),
                            [&](const Tensor& x) {
                              return avg_pool2d(x, c.kernel, c.stride, c.padding, c.ceil_mode, include_pad);
                            },
                            2 * tolerance(dt));
      }
}

TEST(CudaPooling, AdaptiveAvgPoolMatchesCpu) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{2, 3, 7, 7}, {3}}, {{2, 5, 5}, {5}}, {{1, 2, 1, 1}, {1}}, {{2, 2, 8, 8}, {1}}, {{3, 6, 7}, {4, 3}},
      {{16, 32, 28, 28}, {14}}};
  for (const auto& [shape, out] : shapes)
    for (DType dt : kFloatTypes) {
      SCOPED_TRACE(::testing::PrintToString(shape) + " -> " + ::testing::PrintToString(out) + " " + dtype_name(dt));
      expect_same_on_both(random_tensor(shape, dt, true), [&](const Tensor& x) { return adaptive_avg_pool2d(x, out); },
                          2 * tolerance(dt));
    }
}

TEST(CudaPooling, MaxPoolRoutesTiesAndNaNAsTheCpu) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = from_vector<float>({5, 5, 5, 5, 1, nan, nan, 3}, {1, 2, 4});
  expect_same_on_both(x, [](const Tensor& t) { return max_pool2d(t, {1, 2}, {1, 1}); }, 0);
  expect_same_on_both(x, [](const Tensor& t) { return max_pool2d(t, {2}, {1}, {1}); }, 0);
}
