// The autocast policy: which ops run in the lower precision, which in f32, what happens to
// gradients, the weight-cast cache, nesting, and that backward passes are not autocast.
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::random_tensor;

namespace {
Tensor param(const Shape& shape) { return random_tensor(shape, DType::f32).requires_grad_(); }
}  // namespace

TEST(Autocast, OffByDefaultAndGuardsNestAndRestore) {
  EXPECT_FALSE(autocast_enabled(DeviceType::CPU));
  EXPECT_EQ(default_autocast_dtype(DeviceType::CPU), DType::bf16);
  EXPECT_EQ(default_autocast_dtype(DeviceType::CUDA), DType::f16);
  {
    AutocastGuard outer(DeviceType::CPU);
    EXPECT_TRUE(autocast_enabled(DeviceType::CPU));
    EXPECT_EQ(autocast_dtype(DeviceType::CPU), DType::bf16);
    EXPECT_FALSE(autocast_enabled(DeviceType::CUDA));
    {
      AutocastGuard inner(DeviceType::CPU, DType::f16, /*enabled=*/false);
      EXPECT_FALSE(autocast_enabled(DeviceType::CPU));
      Tensor y = matmul(random_tensor({2, 3}), random_tensor({3, 4}));
      EXPECT_EQ(y.dtype(), DType::f32);
    }
    EXPECT_TRUE(autocast_enabled(DeviceType::CPU));
    EXPECT_EQ(autocast_dtype(DeviceType::CPU), DType::bf16);
  }
  EXPECT_FALSE(autocast_enabled(DeviceType::CPU));
}

TEST(Autocast, RejectsNonHalfDtypes) {
  EXPECT_EMBER_ERROR(AutocastGuard(DeviceType::CPU, DType::f32), "autocast", "f16 or bf16", "float32");
  EXPECT_EMBER_ERROR(AutocastGuard(DeviceType::CPU, DType::i64), "autocast", "int64");
}

TEST(Autocast, ProductsRunInLowerPrecisionAndMatchTheF32Result) {
  for (DType low : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(low));
    Tensor x = random_tensor({5, 7}), w = random_tensor({3, 7}), b = random_tensor({3});
    Tensor a = random_tensor({2, 4, 6}), c = random_tensor({2, 6, 5});
    const Tensor lin32 = linear(x, w, b), mm32 = matmul(a, c), bmm32 = bmm(a, c);
    AutocastGuard guard(DeviceType::CPU, low);
    Tensor lin = linear(x, w, b), mm = matmul(a, c), bm = bmm(a, c);
    EXPECT_EQ(lin.dtype(), low);
    EXPECT_EQ(mm.dtype(), low);
    EXPECT_EQ(bm.dtype(), low);
    // Inputs rounded to the half type, products accumulated in f32, result rounded once more.
    const double tol = low == DType::bf16 ? 4e-2 : 8e-3;
    EXPECT_TRUE(all_close(lin.to(DType::f32), lin32, tol, tol * 4));
    EXPECT_TRUE(all_close(mm.to(DType::f32), mm32, tol, tol * 4));
    EXPECT_TRUE(all_close(bm.to(DType::f32), bmm32, tol, tol * 4));
  }
}

TEST(Autocast, NormalisationLossesAndReductionsReturnF32) {
  AutocastGuard guard(DeviceType::CPU);
  Tensor h = matmul(random_tensor({4, 6}), random_tensor({6, 8}));  // bf16
  ASSERT_EQ(h.dtype(), DType::bf16);
  EXPECT_EQ(softmax(h, -1).dtype(), DType::f32);
  EXPECT_EQ(log_softmax(h, -1).dtype(), DType::f32);
  EXPECT_EQ(layer_norm(h, {8}, ones({8}), zeros({8})).dtype(), DType::f32);
  EXPECT_EQ(sum(h).dtype(), DType::f32);
  EXPECT_EQ(mean(h, {1}).dtype(), DType::f32);
  EXPECT_EQ(var(h, {1}).dtype(), DType::f32);
  Tensor target = randint(0, 8, {4});
  EXPECT_EQ(cross_entropy(h, target).dtype(), DType::f32);
  EXPECT_EQ(nn::functional::mse_loss(h, zeros({4, 8}, {DType::bf16})).dtype(), DType::f32);
  // Elementwise ops keep their input's dtype; mixed inputs promote.
  EXPECT_EQ(gelu(h).dtype(), DType::bf16);
  EXPECT_EQ((h + 1.0).dtype(), DType::bf16);
  EXPECT_EQ((h + zeros({4, 8})).dtype(), DType::f32);
  // Only f32 is cast down: f64 and integer products are left alone.
  EXPECT_EQ(matmul(random_tensor({2, 2}, DType::f64), random_tensor({2, 2}, DType::f64)).dtype(), DType::f64);
}

TEST(Autocast, GradientsReachF32ParametersInF32) {
  Tensor w = param({4, 6}), b = param({4});
  Tensor x = random_tensor({8, 6});
  Tensor target = randint(0, 4, {8});
  Tensor ref_w = w.detach().clone().requires_grad_(), ref_b = b.detach().clone().requires_grad_();
  cross_entropy(linear(x, ref_w, ref_b), target).backward();
  {
    AutocastGuard guard(DeviceType::CPU);
    Tensor loss = cross_entropy(linear(x, w, b), target);
    EXPECT_EQ(loss.dtype(), DType::f32);
    loss.backward();
  }
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().dtype(), DType::f32);
  EXPECT_EQ(b.grad().dtype(), DType::f32);
  EXPECT_EQ(w.dtype(), DType::f32);
  EXPECT_TRUE(all_close(w.grad(), ref_w.grad(), 5e-2, 1e-2));
  EXPECT_TRUE(all_close(b.grad(), ref_b.grad(), 5e-2, 1e-2));
}

TEST(Autocast, AWeightUsedTwiceIsCastOnceAndGetsBothGradients) {
  Tensor w = param({5, 5});
  Tensor x = random_tensor({3, 5});
  Tensor ref_w = w.detach().clone().requires_grad_();
  sum(matmul(matmul(x, ref_w), ref_w)).backward();
  AutocastGuard guard(DeviceType::CPU);
  const Tensor c1 = autocast::to_lower(w), c2 = autocast::to_lower(w);
  EXPECT_EQ(c1.impl(), c2.impl());  // cached within the region
  EXPECT_EQ(c1.dtype(), DType::bf16);
  Tensor y = matmul(matmul(x, w), w);
  sum(y).backward();
  EXPECT_TRUE(all_close(w.grad(), ref_w.grad(), 6e-2, 6e-2));
  // The cache does not outlive a backward: weights may change before the next forward.
  const Tensor c3 = autocast::to_lower(w);
  EXPECT_NE(c3.impl(), c1.impl());
}

TEST(Autocast, CastAfterAnOptimizerStepSeesTheNewWeights) {
  Tensor w = param({2, 2});
  Tensor x = ones({1, 2});
  AutocastGuard guard(DeviceType::CPU);
  sum(matmul(x, w)).backward();
  {
    NoGradGuard ng;
    w.fill_(3.0);
  }
  Tensor y = matmul(x, w);
  EXPECT_EQ(y.to(DType::f32).to_vector<float>(), (std::vector<float>{6.0f, 6.0f}));
}

TEST(Autocast, BackwardIsNotAutocast) {
  // A custom backward that multiplies f32 tensors: inside backward, autocast is suspended,
  // so its product stays f32 even though backward() is called inside the guarded region.
  Tensor w = param({3, 3});
  AutocastGuard guard(DeviceType::CPU);
  Tensor seen_dtype;
  w.register_post_accumulate_grad_hook([&](const Tensor& p) { seen_dtype = matmul(p.grad(), p.grad()); });
  sum(matmul(random_tensor({2, 3}), w)).backward();
  ASSERT_TRUE(seen_dtype.defined());
  EXPECT_EQ(seen_dtype.dtype(), DType::f32);
  EXPECT_TRUE(autocast_enabled(DeviceType::CPU));
}

TEST(Autocast, GuardMovesWithoutRestoringTwice) {
  auto make = [] { return AutocastGuard(DeviceType::CPU); };
  {
    AutocastGuard g = make();
    EXPECT_TRUE(autocast_enabled(DeviceType::CPU));
  }
  EXPECT_FALSE(autocast_enabled(DeviceType::CPU));
}
