// group_norm: forward and backward against the double reference over random [N, C, *] shapes,
// group counts, layouts and dtypes; gradcheck in f64; autocast; errors.
#include <algorithm>
#include <string>

#include "core/autocast.h"
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
using ember::testing::norm::grad_tolerance;
using ember::testing::norm::group_conditioning;
using ember::testing::norm::random_channel_shape;
using reference::RefTensor;

namespace {

constexpr double kEps = 1e-5;

// A random divisor of c.
int64_t random_groups(int64_t c) {
  std::vector<int64_t> divisors;
  for (int64_t g = 1; g <= c; ++g)
    if (c % g == 0) divisors.push_back(g);
  return divisors[size_t(uniform_int(0, int64_t(divisors.size()) - 1))];
}

const Shape kFixedShapes[] = {{2, 6, 40}, {5, 4}, {1, 1, 3}, {3, 8, 1, 1}, {2, 6, 4, 5}};

}  // namespace

TEST(GroupNorm, ForwardMatchesReference) {
  for (DType dt : kFloatTypes) {
    for (int trial = 0; trial < 30; ++trial) {
      const Shape shape = trial < 5 ? kFixedShapes[trial] : random_channel_shape(2, 4, 6);
      const int64_t groups = random_groups(shape[1]);
      const bool affine = coin(), non_contiguous = coin();
      SCOPED_TRACE("shape " + shape_str(shape) + " groups " + std::to_string(groups) +
                   (non_contiguous ? " non-contiguous " : " ") + dtype_name(dt));
      Tensor x = random_tensor(shape, dt, non_contiguous, -3.0, 3.0);
      Tensor w = affine ? random_tensor({shape[1]}, dt) : Tensor();
      Tensor b = affine ? random_tensor({shape[1]}, dt) : Tensor();
      const RefTensor rx = reference::from_tensor(x);
      const RefTensor rw = affine ? reference::from_tensor(w) : RefTensor();
      const RefTensor rb = affine ? reference::from_tensor(b) : RefTensor();
      Tensor y = group_norm(x, groups, w, b, kEps);
      EXPECT_EQ(y.dtype(), dt);
      const double tol = tolerance(dt);
      const double atol = 4 * tol * std::max(1.0, group_conditioning(rx, groups, kEps, 2) / 100);
      EXPECT_TRUE(all_close(y, reference::group_norm(rx, groups, affine ? &rw : nullptr, affine ? &rb : nullptr, kEps),
                            tol, atol));
    }
  }
}

TEST(GroupNorm, BackwardMatchesReference) {
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    for (int trial = 0; trial < 20; ++trial) {
      const Shape shape = trial < 5 ? kFixedShapes[trial] : random_channel_shape(2, 4, 6);
      const int64_t groups = random_groups(shape[1]);
      const bool affine = trial % 4 != 1;
      SCOPED_TRACE("shape " + shape_str(shape) + " groups " + std::to_string(groups) + " " + dtype_name(dt));
      Tensor x = random_tensor(shape, dt, coin()).requires_grad_();
      Tensor w = affine ? random_tensor({shape[1]}, dt).requires_grad_() : Tensor();
      Tensor b = affine ? random_tensor({shape[1]}, dt).requires_grad_() : Tensor();
      Tensor g = random_tensor(shape, dt);
      group_norm(x, groups, w, b, kEps).backward(g);
      const RefTensor rx = reference::from_tensor(x.detach());
      const RefTensor rw = affine ? reference::from_tensor(w.detach()) : RefTensor();
      const auto ref = reference::group_norm_backward(reference::from_tensor(g), rx, groups, affine ? &rw : nullptr,
                                                      kEps);
      const double gtol = grad_tolerance(dt) * std::max(1.0, group_conditioning(rx, groups, kEps, 2) / 10);
      EXPECT_TRUE(all_close(x.grad(), ref.dx, gtol, gtol)) << "dx";
      if (affine) {
        const double ptol = gtol * double(shape[0] * (numel_of(shape) / (shape[0] * shape[1])));
        EXPECT_TRUE(all_close(w.grad(), ref.dweight, gtol, ptol)) << "dweight";
        EXPECT_TRUE(all_close(b.grad(), ref.dbias, gtol, ptol)) << "dbias";
      }
    }
  }
}

TEST(GroupNorm, Gradcheck) {
  for (int trial = 0; trial < 5; ++trial) {
    const Shape shape = random_channel_shape(2, 4, 3);
    const int64_t groups = random_groups(shape[1]);
    SCOPED_TRACE("shape " + shape_str(shape) + " groups " + std::to_string(groups));
    Tensor x = random_tensor(shape, DType::f64, coin()).requires_grad_();
    Tensor w = random_tensor({shape[1]}, DType::f64).requires_grad_();
    Tensor b = random_tensor({shape[1]}, DType::f64).requires_grad_();
    ember::testing::expect_gradcheck(
        [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{group_norm(in[0], groups, in[1], in[2])}; },
        {x, w, b});
  }
}

TEST(GroupNorm, AutocastComputesInFloat) {
  Tensor x = random_tensor({2, 4, 3}, DType::bf16);
  EXPECT_EQ(group_norm(x, 2).dtype(), DType::bf16);
  AutocastGuard guard(DeviceType::CPU);
  Tensor y = group_norm(x, 2);
  EXPECT_EQ(y.dtype(), DType::f32);
  EXPECT_TRUE(all_close(y, reference::group_norm(reference::from_tensor(x), 2, nullptr, nullptr, kEps), 1e-5, 1e-5));
}

TEST(GroupNorm, Errors) {
  Tensor x = zeros({2, 6, 4});
  EXPECT_EMBER_ERROR(group_norm(x, 4), "group_norm", "num_groups 4", "6 channels", "[2, 6, 4]");
  EXPECT_EMBER_ERROR(group_norm(x, 0), "group_norm", "num_groups must be positive");
  EXPECT_EMBER_ERROR(group_norm(x, 3, ones({4})), "group_norm", "weight", "[4]", "[6]");
  EXPECT_EMBER_ERROR(group_norm(x, 3, ones({6}), zeros({2, 3})), "group_norm", "bias", "[2, 3]");
  EXPECT_EMBER_ERROR(group_norm(zeros({6}), 3), "group_norm", "[N, C, *]", "[6]");
  EXPECT_EMBER_ERROR(group_norm(zeros({2, 6}, {DType::i32}), 3), "group_norm", "int32");
  EXPECT_EQ(group_norm(zeros({0, 6, 2}), 3, ones({6}), zeros({6})).shape(), (Shape{0, 6, 2}));
}
