// rms_norm: forward and backward against the double reference over random shapes, normalised
// dims, layouts and dtypes; the default eps; gradcheck in f64; autocast; errors.
#include <limits>
#include <string>

#include "core/autocast.h"
#include "kernels/reference/normalization.h"
#include "normalization_test_util.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::coin;
using ember::testing::kFloatTypes;
using ember::testing::random_shape;
using ember::testing::random_tensor;
using ember::testing::tolerance;
using ember::testing::uniform_int;
using ember::testing::norm::grad_tolerance;
using reference::RefTensor;

namespace {

Shape trailing(const Shape& shape, int64_t k) { return Shape(shape.end() - k, shape.end()); }

}  // namespace

TEST(RmsNorm, ForwardMatchesReference) {
  for (DType dt : kFloatTypes) {
    for (int trial = 0; trial < 30; ++trial) {
      const int ndim = int(uniform_int(1, 4));
      const int64_t k = uniform_int(1, std::min(ndim, 2));
      const Shape shape = trial == 0 ? Shape{3, 300} : random_shape(ndim, 7, trial % 10 == 0);
      const Shape ns = trailing(shape, trial == 0 ? 1 : k);
      const bool affine = coin(), non_contiguous = coin();
      SCOPED_TRACE("shape " + shape_str(shape) + " normalized " + shape_str(ns) +
                   (non_contiguous ? " non-contiguous " : " ") + dtype_name(dt));
      Tensor x = random_tensor(shape, dt, non_contiguous, -3.0, 3.0);
      Tensor w = affine ? random_tensor(ns, dt) : Tensor();
      const RefTensor rw = affine ? reference::from_tensor(w) : RefTensor();
      const double eps = coin() ? 1e-6 : 1e-3;
      Tensor y = rms_norm(x, ns, w, eps);
      EXPECT_EQ(y.dtype(), dt);
      const double tol = tolerance(dt);
      EXPECT_TRUE(all_close(y, reference::rms_norm(reference::from_tensor(x), int64_t(ns.size()),
                                                   affine ? &rw : nullptr, eps),
                            tol, 4 * tol));
    }
  }
}

TEST(RmsNorm, DefaultEpsIsTheMachineEpsilon) {
  // a zero row shows eps: y = x / sqrt(eps), so x = 1e-4 gives 1e-4 / sqrt(eps + 1e-8)
  Tensor x = full({1, 1}, 1e-4, {DType::f64});
  const double e64 = std::numeric_limits<double>::epsilon(), e32 = std::numeric_limits<float>::epsilon();
  EXPECT_NEAR(rms_norm(x, {1}).item<double>(), 1e-4 / std::sqrt(1e-8 + e64), 1e-12);
  Tensor xf = full({1, 1}, 1e-4, {DType::f32});
  EXPECT_NEAR(rms_norm(xf, {1}).item<double>(), 1e-4 / std::sqrt(1e-8 + double(e32)), 1e-5);
  Tensor xb = full({1, 1}, 1e-4, {DType::bf16});
  EXPECT_NEAR(rms_norm(xb, {1}).item<double>(), 1e-4 / std::sqrt(1e-8 + double(e32)), 1e-2);
}

TEST(RmsNorm, BackwardMatchesReference) {
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    for (int trial = 0; trial < 20; ++trial) {
      const int ndim = int(uniform_int(1, 3));
      // trial 2 (with weight): rows wider than one 256-column block of the dweight sum
      const Shape shape = trial == 0 ? Shape{70, 40} : trial == 2 ? Shape{40, 600} : random_shape(ndim, 6);
      const int64_t k = trial == 0 || trial == 2 ? 1 : uniform_int(1, ndim);
      const Shape ns = trailing(shape, k);
      const bool affine = trial % 4 != 1;
      SCOPED_TRACE("shape " + shape_str(shape) + " normalized " + shape_str(ns) + " " + dtype_name(dt));
      Tensor x = random_tensor(shape, dt, coin()).requires_grad_();
      Tensor w = affine ? random_tensor(ns, dt).requires_grad_() : Tensor();
      Tensor g = random_tensor(shape, dt);
      rms_norm(x, ns, w, 1e-5).backward(g);
      const RefTensor rw = affine ? reference::from_tensor(w.detach()) : RefTensor();
      const auto ref = reference::rms_norm_backward(reference::from_tensor(g), reference::from_tensor(x.detach()),
                                                    k, affine ? &rw : nullptr, 1e-5);
      const double gtol = grad_tolerance(dt);
      EXPECT_TRUE(all_close(x.grad(), ref.dx, gtol, gtol)) << "dx";
      if (affine) {
        const double rows = double(numel_of(shape) / std::max<int64_t>(1, numel_of(ns)));
        EXPECT_TRUE(all_close(w.grad(), ref.dweight, gtol, gtol * std::max(1.0, rows))) << "dweight";
      }
    }
  }
}

TEST(RmsNorm, Gradcheck) {
  for (int trial = 0; trial < 5; ++trial) {
    const int ndim = int(uniform_int(1, 3));
    const Shape shape = random_shape(ndim, 4);
    const Shape ns = trailing(shape, uniform_int(1, ndim));
    SCOPED_TRACE("shape " + shape_str(shape) + " normalized " + shape_str(ns));
    Tensor x = random_tensor(shape, DType::f64, coin()).requires_grad_();
    Tensor w = random_tensor(ns, DType::f64).requires_grad_();
    ember::testing::expect_gradcheck(
        [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{rms_norm(in[0], ns, in[1], 1e-5)}; }, {x, w});
  }
}

TEST(RmsNorm, AutocastComputesInFloat) {
  Tensor x = random_tensor({3, 8}, DType::bf16);
  Tensor w = random_tensor({8}, DType::f32);
  EXPECT_EQ(rms_norm(x, {8}).dtype(), DType::bf16);
  AutocastGuard guard(DeviceType::CPU);
  Tensor y = rms_norm(x, {8}, w, 1e-6);
  EXPECT_EQ(y.dtype(), DType::f32);
  const RefTensor rw = reference::from_tensor(w);
  EXPECT_TRUE(all_close(y, reference::rms_norm(reference::from_tensor(x), 1, &rw, 1e-6), 1e-5, 1e-5));
}

TEST(RmsNorm, Errors) {
  Tensor x = zeros({2, 3, 4});
  EXPECT_EMBER_ERROR(rms_norm(x, {3}), "rms_norm", "normalized_shape [3]", "[2, 3, 4]");
  EXPECT_EMBER_ERROR(rms_norm(x, {}), "rms_norm", "[2, 3, 4]");
  EXPECT_EMBER_ERROR(rms_norm(x, {4}, ones({3})), "rms_norm", "weight", "[3]", "[4]");
  EXPECT_EMBER_ERROR(rms_norm(x, {4}, ones({4}), -1.0), "rms_norm", "eps");
  EXPECT_EMBER_ERROR(rms_norm(zeros({2, 4}, {DType::i32}), {4}), "rms_norm", "int32");
  EXPECT_EQ(rms_norm(zeros({0, 4}), {4}, ones({4})).shape(), (Shape{0, 4}));
}
